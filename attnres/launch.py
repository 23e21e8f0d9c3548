"""Plan variant x seed grids and run each cell as a ``torchrun`` job.

The launcher creates every run's database row first (status ``queued``) and passes only its id
to the trainer, so what the database says was trained is exactly what was trained. A run whose
process ends without recording an end state is marked failed here, with its exit code and the
last lines of its log: no run stays "running" after its process is gone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import psutil
from sqlalchemy import Engine

from attnres.config import RunConfig
from attnres.data.prepare import dataset_path, ensure_builtin, read_manifest
from attnres.errors import AttnresError
from attnres.tracking import store
from attnres.tracking.db import normalize_url
from attnres.tracking.schema import ACTIVE
from attnres.variants import canonical, resolve_run


@dataclass
class PlannedRun:
    cfg: RunConfig
    skip: str | None = None  # why it will not run (already finished with this config)
    run_id: int | None = None


def logs_dir() -> Path:
    return Path(os.environ.get("ATTNRES_LOGS", "logs"))


@cache
def git_commit() -> str | None:
    """The commit of the attnres checkout, if it is one (recorded with every run)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def plan(engine: Engine | None, variants: list[str], seeds: list[int], preset: str, overrides: list[str],
         data: str = "builtin", force: bool = False) -> list[PlannedRun]:
    """Expand the grid; mark cells that already finished with the same config (unless forced)."""
    if not variants:
        raise AttnresError("name at least one variant (see `attnres variants`)")
    if not seeds:
        raise AttnresError("give at least one seed, e.g. --seeds 42 1337")
    if len(set(seeds)) != len(seeds):
        raise AttnresError(f"seed list repeats a seed: {' '.join(map(str, seeds))}")
    names = [canonical(v) for v in variants]
    if len(set(names)) != len(names):
        raise AttnresError("variant list names the same variant twice")
    grid = [PlannedRun(resolve_run(v, preset, s, overrides, data)) for v in names for s in seeds]
    if engine is not None and not force:
        for cell in grid:
            done = store.finished_with_config(engine, cell.cfg.config_hash)
            if done:
                cell.skip = f"finished as run {done[0]} (use --force to run again)"
    return grid


def torchrun_command(run_id: int | str, db_url: str, nproc: int = 1) -> list[str]:
    """The exact command that trains one run (an argument list; no shell is involved)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "attnres.train", "--", "--run-id", str(run_id), "--db", db_url]


def check_data(name: str) -> None:
    """Make sure a run's dataset exists before anything starts (the built-in one is made on demand)."""
    if name == "builtin":
        ensure_builtin()
    else:
        read_manifest(dataset_path(name))


def tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def settle(engine: Engine, run_id: int, returncode: int, log: Path) -> str:
    """Record the end of a run whose process exited; returns its final status."""
    run = store.get_run(engine, run_id)
    if run.status in ACTIVE:
        store.update_run(engine, run_id, status="failed", ended_at=store.now(), exit_code=returncode,
                         message=f"process exited with code {returncode}\n{tail(log)}")
        return "failed"
    if run.exit_code is None or (returncode != 0 and run.exit_code == 0):
        store.update_run(engine, run_id, exit_code=returncode)
    return run.status


def start(engine: Engine, db: str | None, cell: PlannedRun, nproc: int = 1) -> tuple[subprocess.Popen, Path]:
    """Create the run row and start its torchrun process with output to the run's log file."""
    url = normalize_url(db)
    logs_dir().mkdir(parents=True, exist_ok=True)
    cell.run_id = store.create_run(engine, cell.cfg, world_size=nproc, git_commit=git_commit())
    log = (logs_dir() / f"run-{cell.run_id}.log").resolve()
    store.update_run(engine, cell.run_id, log_path=str(log))
    threads = os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env = os.environ | {"OMP_NUM_THREADS": threads}
    with log.open("ab") as fh:
        proc = subprocess.Popen(torchrun_command(cell.run_id, url, nproc), stdout=fh, stderr=subprocess.STDOUT,
                                env=env, stdin=subprocess.DEVNULL)
    return proc, log


def run_foreground(engine: Engine, db: str | None, cells: list[PlannedRun], nproc: int = 1,
                   on_progress: Callable[[PlannedRun, int, int], None] | None = None,
                   poll: float = 0.5) -> dict[int, str]:
    """Run the planned cells one after another; return {run_id: final status}."""
    for data in {c.cfg.data for c in cells if not c.skip}:
        check_data(data)
    results: dict[int, str] = {}
    for cell in cells:
        if cell.skip:
            continue
        proc, log = start(engine, db, cell, nproc)
        assert cell.run_id is not None
        try:
            while proc.poll() is None:
                if on_progress:
                    on_progress(cell, store.get_run(engine, cell.run_id).step, cell.cfg.train.steps)
                time.sleep(poll)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait(timeout=30)
            store.update_run(engine, cell.run_id, status="killed", ended_at=store.now(), message="interrupted")
            raise
        results[cell.run_id] = settle(engine, cell.run_id, proc.returncode, log)
        if on_progress:
            on_progress(cell, store.get_run(engine, cell.run_id).step, cell.cfg.train.steps)
    return results


def reconcile(engine: Engine) -> list[int]:
    """Mark active runs of this host whose process is gone as failed; return their ids."""
    host = socket.gethostname()
    dead = []
    for run in store.active_runs(engine):
        if run.status == "running" and run.host == host and run.pid and not psutil.pid_exists(run.pid):
            store.update_run(engine, run.id, status="failed", ended_at=store.now(),
                             message=f"process {run.pid} is gone without recording an end\n"
                                     f"{tail(Path(run.log_path)) if run.log_path else ''}")
            dead.append(run.id)
    return dead
