"""Where runs execute: the protocol every backend implements, and the registry of backends.

A backend takes queued runs and makes their trainers run (:meth:`Backend.submit`), continues reopened
ones (:meth:`Backend.resume`), says what it would run (:meth:`Backend.describe`, what ``--dry-run``
prints), says whether a run's process or job still exists (:meth:`Backend.poll`), stops it
(:meth:`Backend.kill`), reads its log (:meth:`Backend.logs`), and marks runs whose job vanished without
recording an end as failed (:meth:`Backend.reconcile`, from ``poll``). The CLI and the queue know
backends only through :func:`get` and this protocol, so a new backend (Kubernetes, Ray, ...) is one
module with a :class:`Backend` subclass and one line in :data:`REGISTRY`. A run's row records the
backend that runs it (``runs.backend``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from attnres.errors import AttnresError, unknown
from attnres.runs import DEFAULT_BACKEND
from attnres.tracking import DatabaseError, states
from attnres.tracking.run_store import RunRecord, RunStore

#: name -> "module:Class" (imported when first used, so a backend's dependencies stay optional)
REGISTRY: dict[str, str] = {
    DEFAULT_BACKEND: "attnres.runs.backends.local:LocalBackend",
    "inline": "attnres.runs.backends.inline:InlineBackend",
    "slurm": "attnres.runs.backends.slurm:SlurmBackend",
}


@dataclass(frozen=True)
class NoOptions:
    """The options of a backend that takes none."""


@dataclass(frozen=True)
class Placement:
    """How each run is placed: its ranks, and the options of the backend that runs it (that backend's own
    typed :attr:`Backend.Options`; None: its defaults)."""

    nproc: int = 1  # ranks per run (per node)
    options: Any = None

    def option(self, name: str, default: Any = None) -> Any:
        """One of the backend's options (``default`` when it has no such option or none were given)."""
        return getattr(self.options, name, default)

    def to_json(self) -> str:
        """As recorded with each run it placed (``runs.placement_json``): a resume places the run the same way."""
        opts = asdict(self.options) if self.options is not None else {}
        return json.dumps({"nproc": self.nproc, "options": opts}, sort_keys=True)


@dataclass
class Submitted:
    """What a submission did, for the CLI to show: lines to print and, if it waited, each run's end."""

    lines: list[str] = field(default_factory=list)
    results: dict[int, str] | None = None


ALIVE, GONE, UNKNOWN = "alive", "gone", "unknown"
#: the columns that tell one attempt of a run from the next (a relaunch or resume gives it new ones)
_ATTEMPT = ("pid", "agent_pid", "job_id")
HEARTBEAT_SILENCE_S = 30.0  # a run that beats every 5 s and was not heard from for this long is gone


def silence(run: RunRecord) -> str | None:
    """Why a running run looks dead from its heartbeat alone (``$ATTNRES_STALE_AFTER_S``), or None.

    Only for runs whose process cannot be looked at: a run on another host, or a cluster job.
    """
    limit = float(os.environ.get("ATTNRES_STALE_AFTER_S", HEARTBEAT_SILENCE_S))
    if run.heartbeat_at is None or (states.now() - run.heartbeat_at).total_seconds() <= limit:
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
    """The protocol. Subclasses set ``name`` and implement submit, poll and kill; ``Options`` declares the
    backend's own options (a frozen dataclass: names, types, defaults), which `launch` flags and
    ``--backend-opt KEY=VALUE`` set."""

    name = "?"
    Options: type = NoOptions

    def options(self, given: dict[str, object]) -> object:
        """This backend's options from what the user gave (flag or ``--backend-opt`` values, by option name;
        text is converted to the option's type). One clear line for an option it does not have."""
        known = {f.name: f for f in fields(self.Options)}
        values = {}
        for key, value in given.items():
            name = key.replace("-", "_")
            if name not in known:
                have = ", ".join(self.flag(n) for n in known) or "none"
                raise AttnresError(f"{self.flag(name)} is not an option of the {self.name} backend "
                                   f"(its options: {have})")
            values[name] = _typed(value, known[name], flag=self.flag(name))
        return self.Options(**values)

    def flag(self, option: str) -> str:
        """The `launch` flag of an option (``--backend-opt name=...`` sets it too)."""
        return getattr(self.Options, "FLAGS", {}).get(option, "--" + option.replace("_", "-"))

    def placement(self, nproc: int, given: dict[str, object]) -> Placement:
        """A placement on this backend, checked (:meth:`check`)."""
        placement = Placement(nproc, self.options(given))
        self.check(placement)
        return placement

    def warning(self, placement: Placement) -> str | None:
        """What the user should hear about a placement this backend will honour differently than asked."""
        return None

    def check(self, placement: Placement) -> None:
        """Refuse, with one clear line (AttnresError), a placement this backend cannot honour."""

    def check_detach(self, detach: bool) -> None:
        """Refuse, with one clear line (AttnresError), ``--detach`` where this backend cannot return before its runs
        end (checked before anything is queued)."""

    def ranks(self, placement: Placement) -> int:
        """How many ranks (processes) each run of this placement trains with: what a token budget is divided by."""
        return placement.nproc

    def submit(self, store: RunStore, run_ids: Sequence[int], placement: Placement, *,
               detach: bool = False, on_tick: Callable[[], None] | None = None) -> Submitted:
        """Make the queued runs' trainers run (in order); wait for them unless ``detach``."""
        raise NotImplementedError

    def resume(self, store: RunStore, run_ids: Sequence[int], placement: Placement, *,
               detach: bool = False, on_tick: Callable[[], None] | None = None) -> Submitted:
        """Make reopened runs (queued again by ``attnres resume``) run; each trainer continues from its run's last
        checkpoint. A backend that places a run differently on its second attempt overrides this."""
        return self.submit(store, run_ids, placement, detach=detach, on_tick=on_tick)

    def placement_of(self, run: RunRecord) -> Placement:
        """How to place a run again on a resume: as its launch placed it (recorded with the run); a run recorded
        before placements were (schema 0010) gets as many ranks as its first attempt had, the defaults otherwise."""
        if run.placement_json:
            recorded = json.loads(run.placement_json)
            known = {f.name for f in fields(self.Options)}
            opts = {k: v for k, v in (recorded.get("options") or {}).items() if k in known}
            return Placement(int(recorded.get("nproc", 1)), self.Options(**opts))
        return Placement(run.world_size or 1, self.Options())

    def describe(self, run_id: int | str, db_url: str, placement: Placement) -> list[str]:
        """What submitting the run would execute, as lines to show (``--dry-run``): its trainer command here."""
        return [shlex.join(trainer_command(run_id, db_url, placement.nproc))]

    def logs(self, store: RunStore, run: RunRecord, lines: int = 40, follow: bool = False) -> Iterator[str]:
        """The last ``lines`` lines of the run's log, then (``follow``) new ones until the run is no longer
        queued or running with a process or job to write it (a gone one, its end not recorded yet, ends the follow
        with one line: `attnres sync` records it). The log is the file the run records (its job's output file on a
        cluster: on a file system this machine shares). AttnresError when there is none (yet, or any more)."""
        path = Path(run.log_path) if run.log_path else None
        if path is None or not path.exists():
            started = run.started_at is not None or run.exit_code is not None
            raise AttnresError(missing_log(run.id, run.log_path, started))
        with path.open(errors="replace") as fh:
            yield from (line.rstrip("\n") for line in fh.readlines()[-lines:] if lines)
            while follow:
                line = fh.readline()
                if line:
                    yield line.rstrip("\n")
                    continue
                if store.status_of(run.id) not in states.ACTIVE:
                    return
                if (gone := self.unrecorded([store.run(run.id)]).get(run.id)) is not None:
                    why = gone[1].splitlines()[0] if gone[1] else "its process is gone"
                    yield f"attnres: run {run.id} is recorded {store.status_of(run.id)}, but {why}: `attnres sync` " \
                          f"records it {gone[0]}"
                    return
                time.sleep(0.5)

    def poll(self, runs: Sequence[RunRecord]) -> dict[int, tuple[str, str]]:
        """For each run: (ALIVE | GONE | UNKNOWN, why), from what this backend can see of it now."""
        raise NotImplementedError

    def kill(self, run: RunRecord, store: RunStore | None = None) -> None:
        """Stop the run's processes (or job) now, before its state is set to killed (``store``: where the run is
        recorded, for a backend that waits on the run's own word)."""
        raise NotImplementedError

    def waits(self, runs: Sequence[RunRecord]) -> list[str]:
        """What this backend's queued ``runs`` wait for, in lines `attnres status` prints under its table (read
        only; none by default: a cluster's queue says it itself, in squeue)."""
        return []

    def unrecorded(self, runs: Sequence[RunRecord]) -> dict[int, tuple[str, str]]:
        """The ends :meth:`reconcile` would record for this backend's active ``runs`` now, derived without a
        write: {run: (state, why)}. A running run whose process or job is gone would end failed (unless its
        spool holds the trainer's own end, which wins)."""
        return {rid: (states.FAILED, why) for rid, (verdict, why) in self.poll(runs).items() if verdict == GONE}

    def reconcile(self, store: RunStore, runs: Sequence[RunRecord], errors: list[str] | None = None) -> list[int]:
        """Mark this backend's active runs whose process or job is gone as failed (monitor).

        Its spool is read first: an end the trainer recorded there (the database was away) wins over
        this guess. A database locked by another writer is not waited for: the verdict comes next time.
        A write the database refused (read-only, full, locked) is skipped, its first line added to ``errors``.
        """
        dead = []
        verdicts = self.poll(runs)  # one look at the processes (or one squeue) for all
        for run in runs:
            verdict, why = verdicts.get(run.id, (UNKNOWN, ""))
            if verdict != GONE:
                continue
            try:
                with store.recover(run, wait=False) as recovered:  # held from our look to the verdict
                    if not recovered.held:  # it is changing hands now (a relaunch, its queue, its trainer starting)
                        continue
                    now = store.run(run.id)
                    if any(getattr(now, col) != getattr(run, col) for col in (*_ATTEMPT, "started_at", "host")):
                        continue  # another attempt, or the trainer's own word since: judged again next time
                    seen = {col: getattr(run, col) for col in _ATTEMPT}
                    if store.move(run.id, states.FAILED, states.MONITOR, where=seen, ended_at=states.now(),
                                  message=why):
                        dead.append(run.id)
            except (DatabaseError, AttnresError, OSError) as exc:
                if errors is not None:
                    errors.append(first_line(exc))
                continue
        return dead

    @staticmethod
    def tried(errors: list[str] | None, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``write(*args, **kwargs)``; None when the database refuses it (read-only, full, locked: judged again next
        time), its first line added to ``errors``."""
        try:
            return write(*args, **kwargs)
        except DatabaseError as exc:
            if errors is not None:
                errors.append(first_line(exc))
            return None


def get(name: str) -> Backend:
    """The backend registered under ``name`` (one clear line for an unknown one)."""
    if name not in REGISTRY:
        raise unknown("backend", name, REGISTRY)
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def missing_log(run_id: int, log_path: str | None, started: bool) -> str:
    """What ``attnres logs`` says when a run's log file is not there: gone, when the run has a log and its
    process started (it wrote there: someone deleted it), else not written yet."""
    if log_path and started:
        return f"run {run_id}'s log {log_path} is gone (deleted?)"
    return f"run {run_id} has no log yet"


def _typed(value: object, spec: Any, flag: str) -> object:
    """A given option value as its field's type (int, float, str, or None where the field allows it)."""
    kind = spec.type if isinstance(spec.type, str) else getattr(spec.type, "__name__", "str")
    if value is None or not isinstance(value, str):
        return value
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        if kind.startswith("bool"):
            return {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}[value.lower()]
    except (ValueError, KeyError):
        raise AttnresError(f"{flag} {value!r}: not a valid {kind.split(' ')[0]}") from None
    return value


def backend_of(run: RunRecord) -> str:
    """The backend a run was recorded with (a run from before backends were recorded: the default)."""
    return run.backend or DEFAULT_BACKEND


def reconcile(store: RunStore, errors: list[str] | None = None) -> list[int]:
    """Every backend's check of the active runs it owns; returns the runs found dead (``errors``: the first line of
    each write the database refused, the run left as it was recorded)."""
    runs = store.active_runs()
    dead: list[int] = []
    for name in sorted({backend_of(r) for r in runs}):
        if name in REGISTRY:
            dead += get(name).reconcile(store, [r for r in runs if backend_of(r) == name], errors)
    return dead


def unrecorded(store: RunStore) -> dict[int, tuple[str, str]]:
    """The ends the reconciler (:func:`reconcile`) would record now, by each backend's look at its active runs:
    {run: (state, why's first line)}. What a read verb shows of them: it only looks (a process check, one squeue)."""
    runs = store.active_runs()
    out: dict[int, tuple[str, str]] = {}
    for name in sorted({backend_of(r) for r in runs}):
        if name in REGISTRY:
            found = get(name).unrecorded([r for r in runs if backend_of(r) == name])
            out |= {rid: (to, why.splitlines()[0] if why else "") for rid, (to, why) in found.items()}
    return out


def waits(store: RunStore, run_ids: Sequence[int]) -> list[str]:
    """What the queued runs of ``run_ids`` wait for, by each backend's own look (:meth:`Backend.waits`)."""
    runs = [r for r in store.active_runs() if r.id in set(run_ids) and r.status == states.QUEUED]
    return [line for name in sorted({backend_of(r) for r in runs}) if name in REGISTRY
            for line in get(name).waits([r for r in runs if backend_of(r) == name])]


def first_line(exc: BaseException) -> str:
    """An error's first line (a database error's driver message, without SQLAlchemy's SQL and links)."""
    lines = str(getattr(exc, "orig", None) or exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def kill(store: RunStore, run_ids: Sequence[int]) -> list[int]:
    """Stop runs now: stop their processes through their backend (a checkpoint first, where the trainer can),
    then mark them killed (user).

    A queued run never starts; a running one loses its whole process group (or its job). Runs
    already ended are left as they are.
    """
    killed = []
    for rid in run_ids:
        run = store.run(rid)
        # Signals first, the record after, all under the run's spool lock: a resume (which reopens the run
        # under the same lock) waits until the old processes are gone, so no two attempts write one spool.
        with store.hold(run):
            run = store.run(rid)
            if run.status not in states.sources(states.USER, states.KILLED):
                continue
            if run.status in states.ACTIVE and backend_of(run) in REGISTRY:  # (an imported run has no
                _stop(get(backend_of(run)), run, store)  # process here; a preempted one has none)
            if store.move(rid, states.KILLED, states.USER, ended_at=states.now(), message="killed by attnres kill"):
                killed.append(rid)
    return killed


def _stop(backend: Backend, run: RunRecord, store: RunStore) -> None:
    """``backend.kill(run)``, with the store where its ``kill`` takes one (a backend written before it did)."""
    if "store" in inspect.signature(backend.kill).parameters:
        backend.kill(run, store=store)
    else:
        backend.kill(run)


def trainer_command(run_id: int | str, db_url: str, nproc: int = 1, rendezvous: Sequence[str] = ()) -> list[str]:
    """The command that trains one run (an argument list; no shell is involved).

    Without ``rendezvous`` arguments it is a standalone torchrun on this machine. torchrun runs through
    :mod:`attnres.runs.torchrun` (torchrun's own code, which skips the interpreter's teardown once
    the run succeeded); a standalone one forks its workers from the agent (``--start-method fork``), which has
    imported torch already: each run starts ~3.5 s sooner on a 2-core CPU than with new interpreters. With a
    rendezvous (SLURM) its workers start as new interpreters: a requeued SLURM job of forked workers was seen
    never to start again (twice, after other jobs on the node), and is not understood yet.
    """
    fork = [] if rendezvous else ["--start-method", "fork"]
    rdzv = list(rendezvous) or ["--standalone"]
    return [sys.executable, "-m", "attnres.runs.torchrun", *rdzv, f"--nproc_per_node={nproc}", *fork,
            "-m", "attnres.train", "--", "--run-id", str(run_id), "--db", db_url]


def log_tail(path: Path | str | None, n: int = 20) -> str:
    """The last lines of a log, for a failed run's message ('' if unreadable)."""
    if not path:
        return ""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
