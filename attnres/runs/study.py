"""A study that runs itself (``attnres study``): stages of ``attnres next --launch`` until the scope's comparisons
are resolved, a budget is spent, or more seeds would not help.

Each stage is exactly what ``attnres next --launch`` starts: the plan's requests, launched by
:func:`attnres.runs.orchestrator.launch_plan` with the plan's pre-registration, so the report tests each stage as
planned. After a stage the plan is made again from what it found. The plan comes from the report package, which the
library never imports: the caller gives a *planner*, a function returning the :class:`Outlook` of the study's scope.

A study is recorded before its first stage (:mod:`attnres.tracking.studies`) with the process driving it, and each
stage is recorded with its launch (``launches.study_id``). So an interrupted study goes on without launching a
stage twice: the runs of its stages still queued or running are waited for, the preempted ones continued from their
checkpoint (``attnres resume``'s path), and only then is the next stage planned. Ctrl-C and SIGTERM stop it at a
safe point, never between the first and the last run of a stage being recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import psutil

from attnres import paths
from attnres.errors import AttnresError
from attnres.runs import orchestrator, planning
from attnres.runs.backends import QueueStopped
from attnres.runs.backends.processes import detached, process_alive
from attnres.runs.study_limits import Limits
from attnres.tracking import states
from attnres.tracking.records import ENDED, INTERRUPTED

if TYPE_CHECKING:
    from attnres.runs.planning import LaunchRequest, PlannedRun
    from attnres.tracking.records import RunRecord, StudyRecord
    from attnres.tracking.run_store import RunStore

# How a study ended (``studies.end_reason``): its comparisons, its plan, or one of its limits
RESOLVED, BEYOND, NOTHING, FAILED = "resolved", "beyond-max-seeds", "nothing-to-launch", "stage-failed"
MAX_RUNS, MAX_HOURS, DEADLINE, MAX_STAGES = "max-runs", "max-hours", "deadline", "max-stages"
POLL_S = 1.0  # how often a study looks at runs it waits for but does not run itself


@dataclass(frozen=True)
class Outlook:
    """What the plan of the study's scope says now (the planner's answer)."""

    label: str  # the scope in words
    scope: dict  # how to choose it again: experiment, preset, budget, data, pick
    requests: list[LaunchRequest]  # the next stage (none: nothing to launch)
    registration: dict  # its pre-registration: the comparisons and the seeds per arm planned
    compared: int  # comparisons the study is to resolve (each variant against the baseline, the top two)
    resolved: int
    waiting: int  # open ones waiting for runs of an incomplete stage
    beyond: int  # open ones needing more seeds per arm than --max-seeds
    going: list[int] = field(default_factory=list)  # the scope's runs queued or running now


@dataclass(frozen=True)
class Progress:
    """Where a study stands: what the CLI shows while it works."""

    study: int
    stage: int  # stages launched so far (the one running, while it runs)
    done: int  # runs of the stage that ended
    total: int  # runs of the stage
    resolved: int | None  # (None: not planned yet by this process)
    compared: int | None
    runs: int  # runs the study's stages hold
    hours: float  # their device-hours


class Watcher(Protocol):
    """What a study tells whoever shows it (the CLI renders; the library does not print)."""

    def stage(self, number: int, batches: Sequence[tuple[LaunchRequest, Sequence[PlannedRun]]]) -> None: ...
    def progress(self, now: Progress) -> None: ...
    def say(self, line: str) -> None: ...


@dataclass(frozen=True)
class Ended:
    """How a study ended, and what it spent."""

    study: int
    reason: str
    message: str
    stages: int
    runs: int
    hours: float


class StudyStopped(Exception):
    """The study was interrupted (Ctrl-C, SIGTERM): it is recorded so, and the message says how to go on."""


def spent(runs: Sequence[RunRecord]) -> tuple[int, float]:
    """The runs a study's stages hold, and their device-hours: each run's wall time (its last attempt's, from its
    start to its end, or to its last heartbeat) times its ranks (processes: GPUs, or CPU ranks). The attempts before
    a resume the study made are kept in ``studies.hours_carried`` (:meth:`_Drive.settle`)."""
    # a run queued again (a resume) still holds its last attempt's clock until its trainer starts: that attempt
    # is in hours_carried already, so it counts nothing until then
    seconds = sum(((r.ended_at or r.heartbeat_at or r.started_at) - r.started_at).total_seconds() * max(1, r.world_size)
                  for r in runs if r.started_at is not None and r.status != states.QUEUED)
    return len(runs), max(0.0, seconds) / 3600


def command_key(scope: Mapping[str, object], given: Mapping[str, object]) -> str:
    """What tells "the same command" again: the scope, the plan's settings and the limits as typed."""
    text = json.dumps({"scope": scope, "limits": given}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def begin(store: RunStore, first: Outlook, design: Mapping[str, object], limits: Limits,
          given: Mapping[str, object]) -> tuple[StudyRecord, bool]:
    """The study a command drives: the unfinished one the same command started (True: it is continued), else a new
    one, recorded now with its scope pinned (``design``: the baseline, the plan's parts and --max-seeds)."""
    scope = {**first.scope, **design}
    key = command_key(scope, given)
    found = store.studies.unfinished(key)
    if found is not None:
        _free(found)
        return found, True
    return store.studies.get(store.studies.create(key, scope, first.label, limits.to_dict())), False


def reopen(store: RunStore, study_id: int, limits: Limits) -> StudyRecord:
    """A recorded study to continue (``--resume ID``), with the limits given now in place of its own."""
    found = store.studies.get(study_id)
    if found.state == ENDED:
        raise AttnresError(f"study {study_id} has ended ({found.end_reason}): a study that has ended is over; the "
                           "same command starts a new one")
    _free(found)
    merged = Limits.from_dict(found.limits).replaced(limits)
    if merged != Limits.from_dict(found.limits):
        store.studies.update(study_id, limits=merged.to_dict())
    return store.studies.get(study_id)


def detach(store: RunStore, study: StudyRecord, entry: Sequence[str]) -> int:
    """Drive the study from a process of its own, in the background (``--detach``), as ``attnres launch --detach``
    runs its queue; returns its pid. ``entry`` is the command that drives a study (``attnres study``): the process
    runs ``ENTRY --resume ID --db URL``, its output in ``logs/study-ID.log``."""
    return detached([*entry, "--resume", str(study.id), "--db", store.url], paths.study_log(study.id))


def _free(study: StudyRecord) -> None:
    """Refuse, in one line, a study another live process drives (two drivers would launch a stage twice)."""
    if study.driver_pid is None:
        return
    here = study.driver_host == socket.gethostname()
    if not here or process_alive(study.driver_pid, since=study.driver_since):
        where = "" if here else f" on {study.driver_host}"
        raise AttnresError(f"study {study.id} is being driven by process {study.driver_pid}{where}: wait for it, or "
                           f"stop it (`kill {study.driver_pid}`) and continue with `attnres study --resume {study.id}`")


def verdict(out: Outlook, scope: Mapping[str, object], limits: Limits, stages: int, runs: int, hours: float,
            now: datetime) -> tuple[str, str] | None:
    """Why a study ends before its next stage, as (reason, message); None: it goes on. ``scope`` is the study's
    recorded scope (its parts and --max-seeds), ``stages``, ``runs`` and ``hours`` what it has spent. The plan is
    asked first: a study with nothing left to launch ends for that reason (resolved, beyond --max-seeds), whatever
    its limits; the limits then stop it before a stage, never during one."""
    still = out.compared - out.resolved
    if not out.requests:
        parts = ", ".join(str(p) for p in scope.get("parts") or ())
        if still == 0 and out.compared:
            return RESOLVED, f"resolved: {out.resolved} of {out.compared} comparison(s)"
        if out.beyond:
            return BEYOND, (f"stopped: beyond --max-seeds: {out.beyond} of the {still} open comparison(s) need more "
                            f"than {scope.get('max_seeds')} seeds per arm")
        why = (f"{out.waiting} of them wait for runs not going (preempted, or queued without a queue: `attnres next` "
               "names them)" if out.waiting else "the plan has no runs for them (`attnres next` says why)")
        return NOTHING, (f"stopped: nothing left to launch ({parts}): {still} comparison(s) open; {why}" if still
                         else f"stopped: nothing left to launch ({parts}) and no comparison to resolve")
    if limits.max_stages is not None and stages >= limits.max_stages:
        return MAX_STAGES, f"stopped: --max-stages {limits.max_stages} reached"
    if limits.deadline is not None and now >= limits.deadline:
        return DEADLINE, f"stopped: the deadline ({limits.deadline_text()}) has passed"
    if limits.max_hours is not None and hours >= limits.max_hours:
        return MAX_HOURS, f"stopped: --max-hours {limits.max_hours:g} spent ({hours:.3g} device-hours)"
    if limits.max_runs is not None and runs >= limits.max_runs:
        return MAX_RUNS, f"stopped: --max-runs {limits.max_runs} spent ({runs} run(s))"
    return None


class _Stop:
    """Ctrl-C and SIGTERM, held until a safe point: noted when they come, and acted on (a KeyboardInterrupt) at the
    next :meth:`check`: before a stage is launched, at each tick of the queue that runs a stage (which then stops its
    runs with a checkpoint, as Ctrl-C stops a launch), or at once while the study sleeps between looks at runs it
    waits for. Never while a stage's runs are being recorded, nor inside the queue between its own steps."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.armed = False

    def __call__(self, signum: int, _frame: object) -> None:
        self.name = signal.Signals(signum).name
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def check(self) -> None:
        """Stop now if a signal came meanwhile."""
        if self.name is not None:
            raise KeyboardInterrupt

    def sleep(self, seconds: float) -> None:
        """Sleep, stopping at once if a signal comes."""
        self.check()
        self.armed = True
        try:
            time.sleep(seconds)
        finally:
            self.armed = False

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # (signals reach the main thread only)
            yield
            return
        old = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


@dataclass
class _Drive:
    """One process driving one study: its store, planner, watcher and stop."""

    store: RunStore
    study: StudyRecord
    planner: Callable[[], Outlook]
    watcher: Watcher
    stop: _Stop = field(default_factory=_Stop)
    last: Outlook | None = None
    tried: set[int] = field(default_factory=set)  # preempted runs this process continued once already

    def spend(self) -> tuple[int, float, StudyRecord]:
        """Runs and device-hours spent so far, and the study as recorded now."""
        record = self.store.studies.get(self.study.id)
        runs, hours = spent(self.store.studies.runs(self.study.id))
        return runs, record.hours_carried + hours, record

    def progress(self, ids: Sequence[int] = ()) -> None:
        runs, hours, record = self.spend()
        done = sum(self.store.status_of(i) not in states.ACTIVE for i in ids)
        out = self.last
        self.watcher.progress(Progress(self.study.id, len(record.stages), done, len(ids),
                                       out.resolved if out else None, out.compared if out else None, runs, hours))

    def ticker(self, ids: Sequence[int]) -> Callable[[], None]:
        """A queue's tick: arm the stop, and show the stage's progress."""
        def tick() -> None:
            self.stop.check()
            self.progress(ids)
        return tick

    def wait(self, ids: Sequence[int]) -> None:
        """Wait for runs that another process runs (the queue of an interrupted stage, a launch of the user's) to
        end; a run whose process is gone ends failed meanwhile (reconcile), never waited for forever."""
        while True:
            orchestrator.reconcile(self.store)
            left = [i for i in ids if self.store.status_of(i) in states.ACTIVE]
            self.progress(ids)
            if not left:
                return
            self.stop.sleep(POLL_S)

    def settle(self) -> None:
        """The study's own runs, before a plan: those still queued or running are waited for, the preempted ones
        continued from their checkpoint, each once (a run preempted again is left to the plan, which waits)."""
        while True:
            runs = self.store.studies.runs(self.study.id)
            if going := [r.id for r in runs if r.status in states.ACTIVE]:
                self.watcher.say(f"study {self.study.id}: waiting for runs {_ids(going)} of its stages")
                self.wait(going)
                continue
            held = [r.id for r in runs if r.status == states.PREEMPTED and r.id not in self.tried]
            if not held:
                return
            self.tried |= set(held)
            # a resumed attempt restarts its run's clock (started_at): the device-hours of the attempts so far are
            # carried first (and given back if the resume is refused, which changes nothing)
            before = self.store.studies.get(self.study.id).hours_carried
            carried = before + spent([r for r in runs if r.id in held])[1]
            self.store.studies.update(self.study.id, driver=os.getpid(), hours_carried=carried)
            self.watcher.say(f"study {self.study.id}: continuing the preempted runs {_ids(held)} of its stages")
            try:
                done = orchestrator.resume(self.store, held, on_tick=self.ticker(held))
            except AttnresError as exc:  # (e.g. its checkpoints are unreadable): said, and left to the plan
                self.store.studies.update(self.study.id, driver=os.getpid(), hours_carried=before)
                self.watcher.say(f"study {self.study.id}: {exc}")
                continue
            for line in done.lines:
                self.watcher.say(line)

    def end(self, reason: str, message: str) -> Ended:
        runs, hours, record = self.spend()
        stages = len(record.stages)
        self.store.studies.update(self.study.id, driver=os.getpid(), state=ENDED, end_reason=reason, message=message,
                                  ended_at=states.now(), runs_spent=runs, hours_spent=hours)
        return Ended(self.study.id, reason, message, stages, runs, hours)

    def stages(self) -> Ended:
        """Stage after stage, until one of the ends."""
        while True:
            self.stop.check()
            self.settle()
            out = self.last = self.planner()
            runs, hours, record = self.spend()
            limits = Limits.from_dict(record.limits)
            self.store.studies.update(self.study.id, driver=os.getpid(), runs_spent=runs, hours_spent=hours)
            self.progress()
            if not out.requests and out.going:  # runs of the scope outside the study: their seeds count, so wait
                self.watcher.say(f"study {self.study.id}: waiting for runs {_ids(out.going)} of the scope")
                self.wait(out.going)
                continue
            if (end := verdict(out, self.study.scope, limits, len(record.stages), runs, hours, states.now())):
                return self.end(*end)
            batches = [(req, planning.plan(self.store, req)) for req in out.requests]
            count = sum(not c.skip for _, cells in batches for c in cells)
            if not count:
                return self.end(NOTHING, "stopped: nothing new to launch: the plan's runs exist already (finished, "
                                         "queued or running)")
            if limits.max_runs is not None and runs + count > limits.max_runs:
                return self.end(MAX_RUNS, f"stopped: --max-runs {limits.max_runs}: the next stage needs {count} "
                                          f"run(s), {limits.max_runs - runs} left (a stage is launched whole: its "
                                          "seeds are registered together)")
            self.stop.check()  # (a signal while planning: no stage is launched)
            self.watcher.stage(len(record.stages) + 1, batches)
            ids, done = orchestrator.launch_plan(self.store, batches, out.registration, study=self.study.id,
                                                 on_queued=self.ticker)
            for line in done.lines:
                self.watcher.say(line)
            if not ids:
                return self.end(NOTHING, "stopped: nothing new to launch: every run of the plan was skipped")
            if not any(self.store.status_of(i) == states.FINISHED for i in ids):
                return self.end(FAILED, f"stopped: no run of stage {len(record.stages) + 1} finished (runs "
                                        f"{_ids(ids)}: `attnres status` says how each ended)")


def drive(store: RunStore, study_id: int, planner: Callable[[], Outlook], watcher: Watcher) -> Ended:
    """Drive a recorded study from this process until it ends; :class:`StudyStopped` when Ctrl-C or SIGTERM stops it
    (recorded interrupted, with what it spent: `attnres study --resume ID` goes on)."""
    study = store.studies.get(study_id)
    _free(study)
    me = psutil.Process()
    since = datetime.fromtimestamp(me.create_time(), UTC).replace(tzinfo=None)
    if not store.studies.claim(study_id, socket.gethostname(), me.pid, since, study.driver_pid):
        raise AttnresError(f"study {study_id} was taken by another process just now")
    run = _Drive(store, store.studies.get(study_id), planner, watcher)
    try:
        with run.stop.installed():
            return run.stages()
    except (KeyboardInterrupt, QueueStopped) as exc:
        runs, hours, record = run.spend()
        why = run.stop.name or "interrupted"
        held = ("; " + ", ".join(f"run {r} {s}" for r, s in exc.results.items())) if isinstance(exc, QueueStopped) \
            else ""
        message = (f"study {study_id} interrupted ({why}) at stage {len(record.stages)}{held}; continue it with "
                   f"`attnres study --resume {study_id}` (or the same command)")
        store.studies.update(study_id, driver=me.pid, state=INTERRUPTED, message=message, runs_spent=runs,
                             hours_spent=hours)
        raise StudyStopped(message) from None
    except Exception as exc:  # (a plan that cannot be made, a database error): recorded, never left "going"
        runs, hours, record = run.spend()
        store.studies.update(study_id, driver=me.pid, state=INTERRUPTED, runs_spent=runs, hours_spent=hours,
                             message=f"study {study_id} stopped at stage {len(record.stages)} by an error: "
                                     f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
                                     f"; continue it with `attnres study --resume {study_id}` once that is mended")
        raise
    finally:
        store.studies.update(study_id, driver=me.pid, driver_pid=None, driver_host=None, driver_since=None)


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(map(str, ids))

