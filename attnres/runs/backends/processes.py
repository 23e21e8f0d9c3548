"""This machine's processes as the local backend sees them: alive or not (and not a later process that reused a
pid), a run's process tree killed, how long a kill lets a trainer save first, and a process started detached."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import psutil

from attnres.durations import env_seconds


def kill_tree(agent_pid: int | None, trainer_pid: int | None) -> None:
    """SIGKILL torchrun and every process below it (workers run in sessions of their own)."""
    procs: list[psutil.Process] = []
    for pid in (agent_pid, trainer_pid):
        if not pid or pid == os.getpid():  # (a run trained in this very process, in process: not ours to kill)
            continue
        try:
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    # Dead is enough: a killed worker whose torchrun died with it stays a zombie until init reaps it
    # (seconds, on some machines), and psutil.wait_procs would wait for that.
    end = time.monotonic() + 10
    while any(process_alive(p.pid) for p in procs) and time.monotonic() < end:
        time.sleep(0.01)


def process_alive(pid: int, since: datetime | None = None) -> bool:
    """Whether ``pid`` is a live process (and, given ``since``, one started no later: not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return since is None or proc.create_time() <= since.replace(tzinfo=UTC).timestamp() + 5
    except psutil.Error:
        return False


def kill_grace_s() -> float:
    """How long `attnres kill` lets a run save its checkpoint before SIGKILL: ``$ATTNRES_KILL_GRACE`` seconds
    (default 30; 0 kills at once)."""
    return env_seconds("ATTNRES_KILL_GRACE", 30.0)


def detached(command: Sequence[str], log: Path) -> int:
    """Start ``command`` (an argument list, no shell) in the background, in a session of its own, its output appended
    to ``log``; return its pid. It outlives the terminal that started it (a hang-up or a Ctrl-C there does not reach
    it): what ``--detach`` starts, a queue (``attnres launch``) or a study (``attnres study``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        proc = subprocess.Popen(list(command), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return proc.pid
