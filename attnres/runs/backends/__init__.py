"""Where runs execute: the protocol every backend implements, and the registry of backends.

A backend takes queued runs and makes their trainers run (:meth:`Backend.submit`), says whether a
run's process or job still exists (:meth:`Backend.poll`), stops it (:meth:`Backend.kill`), and
marks runs whose job vanished without recording an end as failed (:meth:`Backend.reconcile`, from
``poll``). The CLI and the queue know backends only through :func:`get` and this protocol, so a
new backend (Kubernetes, Ray, ...) is one module with a :class:`Backend` subclass and one line in
:data:`REGISTRY`. A run's row records the backend that runs it (``runs.backend``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from attnres.errors import AttnresError, unknown
from attnres.tracking import spool, states, store
from attnres.tracking.schema import Run

#: name -> "module:Class" (imported when first used, so a backend's dependencies stay optional)
REGISTRY: dict[str, str] = {
    "local": "attnres.runs.backends.local:LocalBackend",
    "slurm": "attnres.runs.backends.slurm:SlurmBackend",
}


@dataclass(frozen=True)
class Placement:
    """How each run is placed. A backend reads the fields it knows and refuses what it cannot honour."""

    nproc: int = 1  # ranks per run (per node) on CPU
    gpus_per_run: int = 1  # local: GPUs a run gets when the machine has GPUs
    nodes: int = 1  # cluster backends: nodes per run
    gpus_per_node: int = 0  # cluster backends: 0 = a CPU job of nproc ranks per node
    partition: str | None = None
    time_limit: str | None = None
    options: dict[str, str] = field(default_factory=dict)  # --backend-opt KEY=VALUE, backend-specific


@dataclass
class Submitted:
    """What a submission did, for the CLI to show: lines to print and, if it waited, each run's end."""

    lines: list[str] = field(default_factory=list)
    results: dict[int, str] | None = None


ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"
#: the columns that tell one attempt of a run from the next (a relaunch or resume gives it new ones)
_ATTEMPT = ("pid", "agent_pid", "job_id")
HEARTBEAT_SILENCE_S = 30.0  # a run that beats every 5 s and was not heard from for this long is gone


def silence(run: Run) -> str | None:
    """Why a running run looks dead from its heartbeat alone (``$ATTNRES_STALE_AFTER_S``), or None.

    Only for runs whose process cannot be looked at: a run on another host, or a cluster job.
    """
    limit = float(os.environ.get("ATTNRES_STALE_AFTER_S", HEARTBEAT_SILENCE_S))
    if run.heartbeat_at is None or (store.now() - run.heartbeat_at).total_seconds() <= limit:
        return None
    return f"no heartbeat from {run.host} for more than {limit:g} s\n{log_tail(run.log_path)}"


class QueueStopped(Exception):
    """A waiting submission was interrupted (Ctrl-C): each run's state now, and how to go on."""

    def __init__(self, results: dict[int, str]) -> None:
        self.results = results
        ids = " ".join(str(r) for r, s in results.items() if s in states.RESUMABLE)
        super().__init__("stopped: " + ", ".join(f"run {r} {s}" for r, s in results.items())
                         + (f"; continue with `attnres resume {ids}` or by launching the same grid again" if ids
                            else ""))


class Backend:
    """The protocol. Subclasses set ``name`` and implement submit, poll and kill."""

    name = "?"

    def check(self, placement: Placement) -> None:
        """Refuse, with one clear line (AttnresError), a placement this backend cannot honour."""

    def submit(self, engine: Engine, db_url: str, run_ids: Sequence[int], placement: Placement, *,
               detach: bool = False, on_tick: Callable[[], None] | None = None) -> Submitted:
        """Make the queued runs' trainers run (in order); wait for them unless ``detach``."""
        raise NotImplementedError

    def poll(self, runs: Sequence[Run]) -> dict[int, tuple[str, str]]:
        """For each run: (ALIVE | GONE | UNKNOWN, why), from what this backend can see of it now."""
        raise NotImplementedError

    def kill(self, run: Run) -> None:
        """Stop the run's processes (or job) now. Its state was already set to killed."""
        raise NotImplementedError

    def reconcile(self, engine: Engine, runs: Sequence[Run]) -> list[int]:
        """Mark this backend's active runs whose process or job is gone as failed (monitor).

        Its spool is read first: an end the trainer recorded there (the database was away) wins over
        this guess. A database locked by another writer is not waited for: the verdict comes next time.
        """
        dead = []
        verdicts = self.poll(runs)  # one look at the processes (or one squeue) for all
        for run in runs:
            verdict, why = verdicts.get(run.id, (UNKNOWN, ""))
            if verdict != GONE:
                continue
            try:
                path = store.spool_path(run)
                with spool.held(path, wait=False) as ours:  # nobody changes the run between our look and verdict
                    if not ours:  # it is changing hands now (a relaunch, its queue, its trainer starting)
                        continue
                    if path.exists() and path.stat().st_size:
                        spool.ingest(engine, path)
                    now = store.get_run(engine, run.id)
                    if any(getattr(now, col) != getattr(run, col) for col in (*_ATTEMPT, "started_at", "host")):
                        continue  # another attempt, or the trainer's own word since: judged again next time
                    seen = {col: getattr(run, col) for col in _ATTEMPT}
                    if states.transition(engine, run.id, states.FAILED, states.MONITOR, where=seen,
                                         ended_at=store.now(), message=why):
                        dead.append(run.id)
            except (SQLAlchemyError, AttnresError, OSError):
                continue
        return dead


def get(name: str) -> Backend:
    """The backend registered under ``name`` (one clear line for an unknown one)."""
    if name not in REGISTRY:
        raise unknown("backend", name, REGISTRY)
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def reconcile(engine: Engine) -> list[int]:
    """Every backend's check of the active runs it owns; returns the runs found dead."""
    runs = store.active_runs(engine)
    dead: list[int] = []
    for name in sorted({r.backend or "local" for r in runs}):
        if name in REGISTRY:
            dead += get(name).reconcile(engine, [r for r in runs if (r.backend or "local") == name])
    return dead


def kill(engine: Engine, run_ids: Sequence[int]) -> list[int]:
    """Stop runs now: stop their processes through their backend (a checkpoint first, where the trainer can),
    then mark them killed (user).

    A queued run never starts; a running one loses its whole process group (or its job). Runs
    already ended are left as they are.
    """
    killed = []
    for rid in run_ids:
        run = store.get_run(engine, rid)
        # Signals first, the record after, all under the run's spool lock: a resume (which reopens the run
        # under the same lock) waits until the old processes are gone, so no two attempts write one spool.
        with spool.held(store.spool_path(run)):
            run = store.get_run(engine, rid)
            if run.status not in states.sources(states.USER, states.KILLED):
                continue
            if run.status in states.ACTIVE and (run.backend or "local") in REGISTRY:  # (an imported
                get(run.backend or "local").kill(run)  # run has no process here; a preempted one has none)
            if states.transition(engine, rid, states.KILLED, states.USER, ended_at=store.now(),
                                 message="killed by attnres kill"):
                killed.append(rid)
    return killed


def trainer_command(run_id: int | str, db_url: str, nproc: int = 1, rendezvous: Sequence[str] = ()) -> list[str]:
    """The command that trains one run (an argument list; no shell is involved).

    Without ``rendezvous`` arguments it is a standalone torchrun on this machine. torchrun runs through
    :mod:`attnres.runs.torchrun` (torchrun's own code, which skips the interpreter's teardown once
    the run succeeded).
    """
    rdzv = list(rendezvous) or ["--standalone"]
    return [sys.executable, "-m", "attnres.runs.torchrun", *rdzv, f"--nproc_per_node={nproc}",
            "-m", "attnres.train", "--", "--run-id", str(run_id), "--db", db_url]


def log_tail(path: Path | str | None, n: int = 20) -> str:
    """The last lines of a log, for a failed run's message ('' if unreadable)."""
    if not path:
        return ""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
