"""Plan variant x seed grids and run each cell as a ``torchrun`` job.

The launcher creates every run's database row first (status ``queued``) and passes only its id
to the trainer, so what the database says was trained is exactly what was trained. A run whose
process ends without recording an end state is marked failed here, with its exit code and the
last lines of its log: no run stays "running" after its process is gone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import psutil
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from attnres.config import RunConfig
from attnres.data.prepare import dataset_path, ensure_builtin, read_manifest
from attnres.errors import AttnresError
from attnres.tracking import store
from attnres.tracking.schema import ACTIVE, RESUMABLE
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
            prior = store.runs_with_config(engine, cell.cfg.config_hash)
            done = [r for r, s in prior if s == "finished"]
            active = [r for r, s in prior if s in ACTIVE]
            resumable = [r for r, s in prior if s in RESUMABLE]
            if done:
                cell.skip = f"finished as run {done[0]} (use --force to run again)"
            elif active:
                cell.skip = f"already queued or running as run {active[0]}"
            elif resumable:
                cell.run_id = resumable[-1]  # continue the interrupted run from its checkpoint
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


def settle(engine: Engine, run_id: int, returncode: int, log: Path, pid: int | None = None) -> str:
    """Record the end of a run whose process ``pid`` exited; returns its final status.

    A run re-queued meanwhile (a relaunch or resume) belongs to its new process: left alone.
    """
    run = store.get_run(engine, run_id)
    if pid is not None and run.agent_pid != pid:
        return run.status
    spool = store.spool_path(run)
    if spool.exists() and spool.stat().st_size:
        from attnres.tracking.writer import ingest_spool

        try:
            ingest_spool(engine, spool)  # the run's own last word, if it could not reach the db
        except (AttnresError, SQLAlchemyError):
            pass
        run = store.get_run(engine, run_id)
    if run.status in ACTIVE:
        store.update_run(engine, run_id, status="failed", ended_at=store.now(), exit_code=returncode,
                         message=f"process exited with code {returncode}\n{tail(log)}")
        return "failed"
    if run.exit_code is None or (returncode != 0 and run.exit_code == 0):
        store.update_run(engine, run_id, exit_code=returncode)
    return run.status


def enqueue(engine: Engine, cells: list[PlannedRun], nproc: int = 1, rule: dict | None = None,
            backend: str = "local") -> list[int]:
    """Create queued run rows (or re-queue resumable ones); return the ids to run, in order."""
    ids = []
    for cell in cells:
        if cell.skip:
            continue
        if cell.run_id is None:
            cell.run_id = store.create_run(engine, cell.cfg, world_size=nproc, git_commit=git_commit())
        log = (logs_dir() / f"run-{cell.run_id}.log").resolve()
        store.update_run(engine, cell.run_id, status="queued", log_path=str(log), backend=backend, agent_pid=None,
                         rule_json=json.dumps(rule) if rule else None, exit_code=None, ended_at=None)
        ids.append(cell.run_id)
    logs_dir().mkdir(parents=True, exist_ok=True)
    return ids


STALE_AFTER_S = 30  # a running run whose heartbeat is older than this is dead (beats every 5 s)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reconcile(engine: Engine) -> list[int]:
    """Mark running runs whose process is gone (this host) or whose heartbeat stopped as failed."""
    host = socket.gethostname()
    dead = []
    for run in store.active_runs(engine):
        silent = run.heartbeat_at is not None and (store.now() - run.heartbeat_at).total_seconds() > STALE_AFTER_S
        gone = run.host == host and run.pid and not _alive(run.pid)
        if run.status == "running" and (gone or silent):
            store.update_run(engine, run.id, status="failed", ended_at=store.now(),
                             message=f"process {run.pid} on {run.host} is gone without recording an end\n"
                                     f"{tail(Path(run.log_path)) if run.log_path else ''}")
            dead.append(run.id)
    return dead
