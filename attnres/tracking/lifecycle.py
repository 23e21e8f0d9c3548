"""A run's life above its state machine: what follows a recorded change, and the recovery of a run's spool.

:mod:`attnres.tracking.states` only records (one compare-and-set per change, no side effect). This layer
is what every part of attnres calls to change a run's state:

* :func:`move` records a change and, when it is the run's end and this process is the one that recorded
  it (only one can), starts the run's ``--on-end`` command (:mod:`attnres.tracking.end_facts`);
* :func:`recover` takes a run's spool lock and writes what the spool holds into the database before the
  caller judges the run, under the same lock: the queue that saw a trainer exit, a monitor that found it
  gone, a relaunch reopening it, a trainer starting, ``attnres sync``. Its replay records each state change
  through :func:`move`, so the ends it records start their ``--on-end`` commands from the same place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from attnres.errors import AttnresError
from attnres.tracking import spool, states


def move(engine: Engine, run_id: int, to: str, actor: str, *, where: dict[str, object] | None = None,
         **fields: object) -> states.Outcome:
    """Record a state change (:func:`attnres.tracking.states.transition`), then start the run's ``--on-end``
    command when the change recorded its end."""
    outcome = states.transition(engine, run_id, to, actor, where=where, **fields)
    if outcome and to in states.ENDED and not states.sources(actor, to) <= set(states.ENDED):
        ended(engine, run_id)  # (an end, not a finished run found incomplete or made whole again: once a run)
    return outcome  # (the only place a run's --on-end starts: spools replay their changes through this too)


def ended(engine: Engine, run_id: int) -> None:
    """What follows a recorded end: the run's ``--on-end`` command (never raises)."""
    from attnres.tracking import end_facts  # (the ORM: only once a run ends; `attnres status` reads without it)

    end_facts.run_ended(engine, run_id)


@dataclass
class Recovery:
    """What :func:`recover` did: ``held`` (False: another process holds the spool now, and nothing was read),
    ``read`` (False: ``only_if`` said no), the spool's counts (rows, runs, skipped, refused), and the error
    that kept the spool from the database when ``keep_going`` (else it is raised)."""

    held: bool
    read: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    error: AttnresError | None = None


@contextmanager
def recover(engine: Engine, path: Path, *, wait: bool = True, lock: bool = True, truncate: bool = True,
            only_if: Callable[[], bool] | None = None, keep_going: bool = False) -> Iterator[Recovery]:
    """Hold a run's spool and write what it holds into the database; the caller judges the run inside.

    ``wait`` off: another process holding the spool is not waited for (``held`` False). ``lock`` off only
    for the trainer's own writer, whose appends need no lock and whose start already holds it. ``only_if``
    is asked under the lock, before the spool is read (e.g. "is the run still this process's?": a spool a
    new attempt is writing is not read here). A database that cannot take the spool raises AttnresError
    (the spool is kept); with ``keep_going`` the error is returned in the recovery instead.
    """
    if not lock:
        yield _read(engine, Path(path), truncate, only_if, keep_going)
        return
    with spool.held(path, wait=wait) as ours:
        yield _read(engine, Path(path), truncate, only_if, keep_going) if ours else Recovery(False)


def recover_now(engine: Engine, path: Path, **options: Any) -> Recovery:
    """:func:`recover` where nothing is judged under the lock: the spool is read in, and the lock let go."""
    with recover(engine, path, **options) as done:
        return done


def _read(engine: Engine, path: Path, truncate: bool, only_if: Callable[[], bool] | None,
          keep_going: bool) -> Recovery:
    if only_if is not None and not only_if():
        return Recovery(True)
    try:
        return Recovery(True, True, spool.ingest(engine, path, truncate=truncate, move=move))
    except AttnresError as exc:
        if not keep_going:
            raise
        return Recovery(True, True, error=exc)
