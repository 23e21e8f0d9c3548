"""The local queue: run queued runs on free GPUs (or one at a time on CPU), in the foreground or detached.

Each run gets its own torchrun process in a new process session (so ``attnres kill`` can end the
whole group), ``CUDA_VISIBLE_DEVICES`` for the GPUs assigned to it, and its own log file. When a
process ends, the run's end state is settled and the next queued run takes its GPUs.

    python -m attnres.scheduler --db URL --runs 3 4 5 [--gpus-per-run 1] [--nproc 1]

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from sqlalchemy import Engine

from attnres.errors import AttnresError
from attnres.launch import logs_dir, settle, torchrun_command
from attnres.tracking import store
from attnres.tracking.db import get_engine, normalize_url
from attnres.tracking.schema import ACTIVE


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
    log = Path(run.log_path or (logs_dir() / f"run-{run_id}.log"))
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    else:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    with log.open("ab") as fh:
        proc = subprocess.Popen(torchrun_command(run_id, db_url, nproc), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    store.update_run(engine, run_id, agent_pid=proc.pid)
    return Slot(proc, log, gpus)


def run_queue(engine: Engine, db: str | None, run_ids: list[int], nproc: int = 1, gpus_per_run: int = 1,
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
            status = store.get_run(engine, rid).status
            if status != "queued":  # killed while waiting
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


def detach(db: str | None, run_ids: list[int], nproc: int, gpus_per_run: int) -> int:
    """Start the queue in the background (new session, output to a log); return its pid."""
    logs_dir().mkdir(parents=True, exist_ok=True)
    log = logs_dir() / f"queue-{run_ids[0]}.log"
    cmd = [sys.executable, "-m", "attnres.scheduler", "--db", normalize_url(db), "--nproc", str(nproc),
           "--gpus-per-run", str(gpus_per_run), "--runs", *map(str, run_ids)]
    with log.open("ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return proc.pid


def kill(engine: Engine, run_ids: list[int]) -> list[int]:
    """Stop runs now: queued ones never start, running ones lose their whole process group."""
    from attnres import slurm

    killed = []
    for rid in run_ids:
        run = store.get_run(engine, rid)
        if run.status not in ACTIVE and run.status != "preempted":
            continue
        store.update_run(engine, rid, status="killed", ended_at=store.now(), message="killed by attnres kill")
        if run.backend == "slurm" and run.job_id:
            slurm.cancel(run.job_id)
        else:
            kill_tree(run.agent_pid, run.pid if run.host == socket.gethostname() else None)
        killed.append(rid)
    return killed


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="attnres.scheduler", description="run queued attnres runs")
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
