"""The local backend: a queue that runs queued runs on this machine's free GPUs, or one at a time on CPU.

Each run gets its own torchrun process in a new process session (so a kill can end the whole
group), ``CUDA_VISIBLE_DEVICES`` for the GPUs assigned to it, and its own log file. When a process
ends, the queue (the run's supervisor) settles the run: it ingests what the trainer could not
write, and a run whose trainer recorded no end is failed with its exit code and last log lines.

    python -m attnres.backends.local --db URL --runs 3 4 5 [--gpus-per-run 1] [--nproc 1]

is what ``attnres launch --detach`` starts in the background: it outlives the terminal.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from attnres import paths
from attnres.backends import ALIVE, GONE, UNKNOWN, Backend, Placement, Submitted, log_tail, trainer_command
from attnres.errors import AttnresError
from attnres.tracking import spool, states, store
from attnres.tracking.db import get_engine, normalize_url
from attnres.tracking.schema import Run

STALE_AFTER_S = 30  # a run on another host whose heartbeat is older than this is dead (beats every 5 s)


def visible_gpus() -> list[int]:
    """GPU indices this machine offers (honouring an existing CUDA_VISIBLE_DEVICES)."""
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA means CPU scheduling
        n = 0
    return list(range(n))


@dataclass
class Slot:
    proc: subprocess.Popen
    log: Path
    gpus: list[int] = field(default_factory=list)


def start(engine: Engine, db_url: str, run_id: int, nproc: int, gpus: list[int]) -> Slot:
    """Start one run's torchrun in its own session, output appended to the run's log."""
    run = store.get_run(engine, run_id)
    log = Path(run.log_path) if run.log_path else paths.run_log(run_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    else:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    with log.open("ab") as fh:
        proc = subprocess.Popen(trainer_command(run_id, db_url, nproc), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    store.update_run(engine, run_id, agent_pid=proc.pid)
    return Slot(proc, log, gpus)


def settle(engine: Engine, run_id: int, returncode: int, log: Path, pid: int | None = None) -> str:
    """Record the end of a run whose process ``pid`` exited; returns its final status.

    A run re-queued meanwhile (a relaunch or resume) belongs to its new process: left alone.
    """
    run = store.get_run(engine, run_id)
    if pid is not None and run.agent_pid != pid:
        return run.status
    path = store.spool_path(run)
    if path.exists() and path.stat().st_size:
        try:
            spool.ingest(engine, path)  # the run's own last word, if it could not reach the database
        except (AttnresError, SQLAlchemyError, OSError):
            pass
    if states.transition(engine, run_id, states.FAILED, states.SUPERVISOR, ended_at=store.now(), exit_code=returncode,
                         message=f"process exited with code {returncode}\n{log_tail(log)}"):
        return states.FAILED
    run = store.get_run(engine, run_id)
    if run.exit_code is None or (returncode != 0 and run.exit_code == 0):
        store.update_run(engine, run_id, exit_code=returncode)
    return run.status


def run_queue(engine: Engine, db: str | None, run_ids: Sequence[int], nproc: int = 1, gpus_per_run: int = 1,
              on_tick: Callable[[], None] | None = None, poll: float = 0.5) -> dict[int, str]:
    """Run the given queued runs to completion; returns {run_id: final status}."""
    url = normalize_url(db)
    free = visible_gpus()
    per_run = gpus_per_run if free else 0
    if free and per_run > len(free):
        raise AttnresError(f"--gpus-per-run {per_run} but this machine has {len(free)} GPU(s)")
    pending, active, results = deque(run_ids), {}, {}
    while pending or active:
        while pending and ((per_run and len(free) >= per_run) or (not per_run and not active)):
            rid = pending.popleft()
            status = store.status_of(engine, rid)
            if status != states.QUEUED:  # killed while waiting
                results[rid] = status
                continue
            gpus, free = free[:per_run], free[per_run:]
            active[rid] = start(engine, url, rid, per_run or nproc, gpus)
        for rid, slot in list(active.items()):
            if slot.proc.poll() is not None:
                results[rid] = settle(engine, rid, slot.proc.returncode, slot.log, slot.proc.pid)
                free = sorted(free + slot.gpus)
                del active[rid]
        if on_tick:
            on_tick()
        if pending or active:
            time.sleep(poll)
    return results


def start_detached(db: str | None, run_ids: Sequence[int], nproc: int, gpus_per_run: int) -> int:
    """Start the queue in the background (new session, output to a log); return its pid."""
    log = paths.queue_log(run_ids[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "attnres.backends.local", "--db", normalize_url(db), "--nproc", str(nproc),
           "--gpus-per-run", str(gpus_per_run), "--runs", *map(str, run_ids)]
    with log.open("ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return proc.pid


def kill_tree(agent_pid: int | None, trainer_pid: int | None) -> None:
    """SIGKILL torchrun and every process below it (workers run in sessions of their own)."""
    procs: list[psutil.Process] = []
    for pid in (agent_pid, trainer_pid):
        if not pid:
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
    psutil.wait_procs(procs, timeout=10)


def process_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class LocalBackend(Backend):
    """Runs on this machine, through the queue above."""

    name = "local"

    def check(self, placement: Placement) -> None:
        if placement.nproc < 1 or placement.gpus_per_run < 1:
            raise AttnresError("--nproc and --gpus-per-run must be at least 1")
        if placement.nodes != 1:
            raise AttnresError("the local backend runs on this machine: --nodes must be 1")

    def submit(self, engine: Engine, db_url: str, run_ids: Sequence[int], placement: Placement, *,
               detach: bool = False, on_tick: Callable[[], None] | None = None) -> Submitted:
        if detach:
            pid = start_detached(db_url, run_ids, placement.nproc, placement.gpus_per_run)
            return Submitted([f"queued runs {', '.join(map(str, run_ids))}; queue running in the background "
                              f"(pid {pid}); follow with `attnres status --watch` or `attnres logs RUN -f`"])
        results = run_queue(engine, db_url, run_ids, placement.nproc, placement.gpus_per_run, on_tick=on_tick)
        return Submitted(results=results)

    def poll(self, runs: Sequence[Run]) -> dict[int, tuple[str, str]]:
        """A run on this host is alive while its trainer (or torchrun) process is; on another host
        while its heartbeat is fresh. Heartbeat age alone never condemns a run on this host."""
        host, out = socket.gethostname(), {}
        for run in runs:
            if run.status != states.RUNNING:
                out[run.id] = (UNKNOWN, "")
            elif run.host == host and (run.pid or run.agent_pid):
                alive = any(process_alive(p) for p in (run.pid, run.agent_pid) if p)
                out[run.id] = (ALIVE, "") if alive else (
                    GONE, f"process {run.pid} on {run.host} is gone without recording an end\n{log_tail(run.log_path)}")
            elif run.heartbeat_at is not None and (store.now() - run.heartbeat_at).total_seconds() > STALE_AFTER_S:
                out[run.id] = (GONE, f"no heartbeat from {run.host} for more than {STALE_AFTER_S} s\n"
                                     f"{log_tail(run.log_path)}")
            else:
                out[run.id] = (ALIVE, "")
        return out

    def kill(self, run: Run) -> None:
        kill_tree(run.agent_pid, run.pid if run.host == socket.gethostname() else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="attnres.backends.local", description="run queued attnres runs")
    p.add_argument("--db", required=True)
    p.add_argument("--runs", type=int, nargs="+", required=True)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--gpus-per-run", type=int, default=1)
    args = p.parse_args(argv)
    engine = get_engine(args.db)
    results = run_queue(engine, args.db, args.runs, args.nproc, args.gpus_per_run)
    for rid, status in results.items():
        print(f"run {rid}: {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
