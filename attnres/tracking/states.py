"""A run's life: its states, which transitions are allowed, who may make each, and the one write.

Every change of a run's ``status`` in attnres goes through :func:`transition` (or :func:`create`,
which gives a new row its first state). A transition is one ``UPDATE ... WHERE status IN (...)``:
a compare-and-set in one database transaction, so two writers can never undo each other. A run
the user killed stays killed, and an end that was decided (finished, failed, diverged, stopped,
killed) is never overwritten by a late writer; only a relaunch reopens a resumable run.

Who may do what (``actor``: the part of attnres that makes the change)::

    launcher    attnres launch/resume    creates runs (queued); reopens failed/killed/preempted ones
    trainer     the run's own process    queued/running/preempted -> running, then its end:
                                         finished, diverged, stopped, preempted or failed
    supervisor  the queue that started   queued/running -> failed when the process exited
                the trainer's process    without recording an end; queued -> preempted when the
                                         queue is stopped (Ctrl-C) before the run started;
                                         finished <-> incomplete as its rows are all in or not
    monitor     the reconciler (sync,    queued/running -> failed when the process is gone, its
                launch, resume first)    heartbeat stopped or its SLURM job vanished; queued ->
                                         preempted when its queue is gone; finished <-> incomplete
    user        attnres kill             queued/running/preempted -> killed
    importer    attnres import           creates runs in any state (they were recorded elsewhere)
    restorer    attnres sync             recreates a run lost with its database, as its spool has it

This module only records: it has no side effect beyond the row. What follows a change (the run's
``--on-end`` command once its end is recorded) is :mod:`attnres.tracking.lifecycle`'s, which every
part of attnres calls to change a state.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from sqlalchemy import Engine

QUEUED, RUNNING, FINISHED, FAILED = "queued", "running", "finished", "failed"
KILLED, DIVERGED, STOPPED, PREEMPTED = "killed", "diverged", "stopped", "preempted"
INCOMPLETE = "incomplete"  # recorded finished, but the database lacks logged steps (attnres.tracking.completeness)
STATES = (QUEUED, RUNNING, FINISHED, FAILED, KILLED, DIVERGED, STOPPED, PREEMPTED, INCOMPLETE)
ACTIVE = (QUEUED, RUNNING)  # a process owns the run, or will
RESUMABLE = (FAILED, KILLED, PREEMPTED, INCOMPLETE)  # a relaunch continues these from their checkpoint
EARLY = (DIVERGED, STOPPED, KILLED, FAILED, INCOMPLETE)  # not a complete curve, for a reason reports give
ENDED = (FINISHED, FAILED, KILLED, DIVERGED, STOPPED, INCOMPLETE)  # decided; only the launcher reopens them

LAUNCHER, TRAINER, SUPERVISOR, MONITOR, USER, IMPORTER, RESTORER = (
    "launcher", "trainer", "supervisor", "monitor", "user", "importer", "restorer")

_OPEN = frozenset({QUEUED, RUNNING, PREEMPTED})  # what a (re)starting trainer may find

#: actor -> target state -> the states it may come from
TRANSITIONS: dict[str, dict[str, frozenset[str]]] = {
    LAUNCHER: {QUEUED: frozenset(RESUMABLE)},
    TRAINER: {to: _OPEN for to in (RUNNING, FINISHED, DIVERGED, STOPPED, PREEMPTED, FAILED)},
    SUPERVISOR: {FAILED: frozenset(ACTIVE), PREEMPTED: frozenset({QUEUED}), INCOMPLETE: frozenset({FINISHED}),
                 FINISHED: frozenset({INCOMPLETE})},
    MONITOR: {FAILED: frozenset(ACTIVE), PREEMPTED: frozenset({QUEUED}),  # (preempted: its queue is gone)
              INCOMPLETE: frozenset({FINISHED}), FINISHED: frozenset({INCOMPLETE})},  # (holes; filled by a sync)
    USER: {KILLED: _OPEN},
}

#: actor -> the states a row it creates may start in
INITIAL: dict[str, frozenset[str]] = {
    LAUNCHER: frozenset({QUEUED}),
    IMPORTER: frozenset(STATES),
    RESTORER: frozenset(STATES),
}


def now() -> datetime:
    """The time as runs record it: UTC, without a zone (SQLite keeps no zone)."""
    return datetime.now(UTC).replace(tzinfo=None)


class TransitionError(ValueError):
    """A transition that no state allows for this actor: a programming error, not a race."""


class ActiveTwin(Exception):
    """The database refused a second active (queued or running) run of the same config."""


def sources(actor: str, to: str) -> frozenset[str]:
    """The states from which ``actor`` may move a run to ``to`` (TransitionError if from none)."""
    allowed = TRANSITIONS.get(actor, {}).get(to)
    if not allowed:
        raise TransitionError(f"{actor} may never set a run {to}")
    return allowed


def allowed(actor: str, current: str, to: str) -> bool:
    """Whether ``actor`` may move a run from ``current`` to ``to``."""
    return current in TRANSITIONS.get(actor, {}).get(to, frozenset())


class Outcome(NamedTuple):
    """What a transition did: ``applied``, and the run's status now (None: no such run)."""

    applied: bool
    status: str | None

    def __bool__(self) -> bool:
        return self.applied


def transition(engine: Engine, run_id: int, to: str, actor: str, *, where: dict[str, object] | None = None,
               **fields: object) -> Outcome:
    """Move a run to ``to`` if its current state allows it for ``actor``; ``fields`` go with it.

    One ``UPDATE ... WHERE id = ? AND status IN (allowed sources) [AND column = value ...]``: if
    another writer changed the state first (or, with ``where``, the row no longer matches, e.g. a
    relaunch gave it another process), nothing is written and the outcome says what the state is.
    """
    if "status" in fields:
        raise TransitionError("give the new state as `to`, not as a field")
    from sqlalchemy import select, update
    from sqlalchemy.exc import IntegrityError

    from attnres.tracking.schema import Run  # (not at import: `attnres status` reads states without SQLAlchemy)

    allowed_from = sources(actor, to)
    try:
        with engine.begin() as conn:
            match = [getattr(Run, col) == value for col, value in (where or {}).items()]
            stmt = update(Run).where(Run.id == run_id, Run.status.in_(allowed_from), *match).values(status=to, **fields)
            outcome = (Outcome(True, to) if conn.execute(stmt).rowcount else
                       Outcome(False, conn.execute(select(Run.status).where(Run.id == run_id)).scalar()))
    except IntegrityError as exc:  # reopening a run whose config is already active elsewhere
        raise ActiveTwin(str(exc.orig)) from None
    return outcome


def create(engine: Engine, actor: str, status: str, **columns: object) -> int:
    """Insert a run row in its first state (one the actor may create); return its id.

    With ``id`` among the columns (a run restored from its spool) the row keeps that id.
    """
    from sqlalchemy import insert, text
    from sqlalchemy.exc import IntegrityError

    from attnres.tracking.schema import Run

    if status not in INITIAL.get(actor, frozenset()):
        raise TransitionError(f"{actor} may not create a run {status}")
    try:
        with engine.begin() as conn:
            run_id = int(conn.execute(insert(Run).values(status=status, **columns)).inserted_primary_key[0])
            if "id" in columns and engine.dialect.name == "postgresql":  # an explicit id: move the sequence past it
                conn.execute(text("SELECT setval(pg_get_serial_sequence('runs', 'id'), "
                                  "GREATEST((SELECT MAX(id) FROM runs), 1))"))
            return run_id
    except IntegrityError as exc:  # another launcher queued the same config first
        raise ActiveTwin(str(exc.orig)) from None
