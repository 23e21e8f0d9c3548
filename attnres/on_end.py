"""The user's ``--on-end`` command as a process: started with the facts of a run's end in its environment, watched
on a thread, stopped past its time, and waited for (briefly) by a process about to leave.

What the command is told comes from the database (:mod:`attnres.tracking.end_facts`, called by the lifecycle layer
once exactly one process records a run's end); this module only runs it. It is an argument list, never given to a
shell; it starts at once and is waited for on a thread, so no writer waits on it. A command that cannot start,
fails or outlives ``ATTNRES_ON_END_TIMEOUT`` seconds (default 300: it is then stopped, with its children) costs one
warning line and changes nothing recorded. A process about to leave (the trainer, a command-line verb) waits for its
commands 30 s at most, then leaves them running unwatched. The command gets the recording process's environment
without torchrun's rank variables.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from attnres.durations import env_seconds
from attnres.logline import say

_waiting: list[threading.Thread] = []
_lock = threading.Lock()


def timeout_s() -> float:
    return env_seconds("ATTNRES_ON_END_TIMEOUT", 300.0)


#: what torchrun gives its workers: not the command's business (it is no rank of the run)
_TORCHRUN = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                       "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})


def _environment(facts_: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in _TORCHRUN and not k.startswith("TORCHELASTIC_")}
    return {**keep, **facts_}


def start(run_id: int, argv: Sequence[str], facts: dict[str, str]) -> None:
    """Start run ``run_id``'s ``--on-end`` command ``argv`` with the facts of its end in its environment, and
    watch it on a thread; never raises (a failure is one warning)."""
    try:
        proc = subprocess.Popen(list(argv), env=_environment(facts), stdin=subprocess.DEVNULL,
                                start_new_session=True)  # (a Ctrl-C or kill of our group is not its end)
    except (OSError, ValueError) as exc:
        say(f"attnres: warning: run {run_id}'s --on-end command {argv[0]!r} could not start: {exc}", err=True)
        return
    waiter = threading.Thread(target=_wait, args=(proc, run_id, argv), name="attnres-on-end", daemon=True)
    with _lock:
        if not _waiting:
            atexit.register(wait)  # a command-line verb does not leave before its commands are done
        _waiting.append(waiter)
    waiter.start()


def _wait(proc: subprocess.Popen, run_id: int, argv: Sequence[str]) -> None:
    try:
        code = proc.wait(timeout_s())
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its session: a script's children too
        except OSError:
            proc.kill()
        proc.wait()
        say(f"attnres: warning: run {run_id}'s --on-end command {argv[0]!r} ran past {timeout_s():g} s "
            "(ATTNRES_ON_END_TIMEOUT) and was stopped", err=True)
        return
    if code != 0:
        say(f"attnres: warning: run {run_id}'s --on-end command {argv[0]!r} exited with {code}", err=True)


LEAVING_WAIT_S = 30.0  # how long a process about to leave (a trainer holding its GPU, a command) waits for them


def wait(timeout: float = LEAVING_WAIT_S) -> None:
    """Wait for the commands this process started, up to ``timeout`` (a process about to leave calls it).

    A command still going then is left running in its own session, unwatched (one line says so): the
    trainer's GPU and the queue's slot are not held for a slow notification.
    """
    deadline = time.monotonic() + min(timeout, timeout_s() + 5)
    with _lock:
        waiting = list(_waiting)
    for waiter in waiting:
        waiter.join(max(0.0, deadline - time.monotonic()))
    with _lock:
        left = [w for w in _waiting if w.is_alive()]
        _waiting.clear()  # (given up on: not waited for again when the process leaves)
    if left:
        say(f"attnres: {len(left)} --on-end command(s) still running after {timeout:g} s: left running, "
            "their exit not watched", err=True)
