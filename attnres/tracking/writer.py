"""A metric writer that never blocks or kills training and never loses a recorded value.

Every value and every change of the run is first appended to the run's *spool* (see
:mod:`attnres.tracking.spool`), then written to the database in batches by a background thread. A
"database is locked" error is retried; an unreachable, read-only or deleted database leaves the
rows in the spool, and the next successful write (or ``attnres sync``) ingests them. The spool is
emptied only when everything in it is in the database.

The spool holds the whole run while it is active: if the database is deleted mid-run, every
value is still on disk. It is emptied when the writer closes (the run has ended), and only once
the database at the configured location is confirmed to hold it all. A spool deleted or replaced
mid-run (its logs folder removed) is noticed within a second and made again, holding the run's row
and everything the database has not confirmed yet. A spool that cannot be written (a full disk, a
file-size limit, a read-only folder) keeps the lines it could not take in memory, in order, and they
are written to it once it takes them again (tried every interval): training goes on. A writer that
closes with lines in memory that neither the spool nor the database has taken waits for a full disk
to have room (``$ATTNRES_DISK_WAIT_S``, default 600 s), and says plainly what it could not keep.

The writer speaks for the trainer: its state changes go through :mod:`attnres.tracking.states`
as the ``trainer`` actor, so a run killed or failed meanwhile keeps that end.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from attnres.durations import env_seconds
from attnres.errors import AttnresError
from attnres.logline import say
from attnres.tracking import confirm, lifecycle, run_rows, spool, states
from attnres.tracking.db import check_location
from attnres.tracking.spool_file import SpoolFile


def _transient(exc: Exception | None) -> bool:
    """A write refused for a moment: the database locked by another writer (SQLite) past the busy timeout."""
    return isinstance(exc, OperationalError) and any(w in str(exc).lower() for w in ("locked", "busy"))


PROGRESS = frozenset({"step", "heartbeat_at"})  # bookkeeping a later line's flush may carry to the OS
# errors a disk recovers from by itself (space freed, quota raised): a closing writer waits for them to pass
PASSING = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_wait_s() -> float:
    """How long a closing writer waits for a full disk to take what is held in memory only."""
    return env_seconds("ATTNRES_DISK_WAIT_S", 600.0)


class Mirroring(Protocol):
    """Where the writer hands what the database took, to be sent on (:class:`attnres.mirrors.sender.Sender`)."""

    def send(self, rows: list[tuple[int, dict[str, float]]]) -> None: ...
    def catch_up(self) -> None: ...
    def status(self, to: str) -> None: ...
    def close(self, timeout: float = ...) -> bool: ...


class MetricWriter:
    """Buffered, background, spool-backed writer of one run's metrics and state."""

    def __init__(self, engine: Engine, run_id: int, spool_path: Path, interval: float = 2.0,
                 mirror: Mirroring | None = None) -> None:
        self.engine, self.run_id, self.spool, self.interval = engine, run_id, Path(spool_path), interval
        self.mirror = mirror  # gets what the database took (the mirrors' own thread sends it on)
        self.lock = threading.Lock()
        self.pending: list[tuple[int, dict[str, float]]] = []  # (step, values) as added; rows are made off-thread
        self.fields: dict[str, object] = {}  # bookkeeping columns, latest value wins
        self.moves: list[tuple[str, dict[str, object]]] = []  # state changes, in order
        self.drops: list[int] = []  # resume points: the database's values past them go first
        self.last_row: tuple[str | None, int | None] = (None, None)  # (key, step) of the last value written
        self.snapshot: dict[str, object] = {}  # the whole run row, kept at the spool's head
        self.refused: list[tuple[str, str | None]] = []  # (asked, what the run was): an end decided elsewhere
        self.failures = 0
        self.last_error: Exception | None = None  # of the last failed write (a lock is worth another try)
        self.wake = threading.Event()
        self.done = threading.Event()
        self.idle = threading.Event()
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        self._metrics_line, self._step_line = spool.line_makers(run_id)
        self.file = SpoolFile(self.spool, self._recreate, retry_s=interval)
        # what the background thread is writing to the database now: neither pending nor confirmed
        self._inflight: tuple[list, dict, list, list] | None = None
        self.thread = threading.Thread(target=self._loop, name="attnres-metric-writer", daemon=True)
        self.thread.start()

    # -- producer side (training thread) ----------------------------------------------------------
    @property
    def spool_ok(self) -> bool:
        """Whether the spool took every line so far (False: some wait in memory for it)."""
        return self.file.ok

    def _append(self, line: str, flush: bool = True) -> None:
        """Append a line to the spool; ``flush`` hands it (and the lines held before it) to the OS now."""
        self.file.append(line, flush)

    def _recreate(self) -> tuple[bytes, str]:
        """Leave a spool that is gone from its path; the lines that make the next one hold, alone, everything
        the database may lack: the run's row (snapshot), then what is being written to the database now and
        what waits to be, in order (resume points, values, columns, state changes); and what they hold, in words.

        Values the database already took are not written again, and neither are its confirmed resume points
        (replayed, they would drop this attempt's confirmed values past them).
        """
        lines = [spool.snapshot_line(self.run_id, self.snapshot)] if self.snapshot else []
        values = 0
        for entries, fields, moves, drops in (self._inflight or ([], {}, [], []),
                                              (self.pending, self.fields, self.moves, self.drops)):
            lines += [spool.drop_line(self.run_id, step) for step in drops]
            lines += [self._metrics_line(step, vals) for step, vals in entries]
            values += sum(len(vals) for _, vals in entries)
            if fields:
                lines.append(spool.fields_line(self.run_id, fields))
            lines += [spool.fields_line(self.run_id, {"status": to, **extra}) for to, extra in moves]
        return "".join(lines).encode(), f"the {values} value(s) the database has not confirmed yet"

    def held_values(self) -> tuple[int, int | None, int | None]:
        """Metric values in memory only, (count, first step, last step): lines the spool has not taken, of values
        the database has not taken either."""
        with self.lock:
            if self.file.ok or not self.file.held:
                return 0, None, None
            unspooled = spool.value_keys("".join(self.file.held))
            unwritten = {(step, key) for entries in (self.pending, (self._inflight or ([],))[0])
                         for step, values in entries for key in values}
        lost = sorted(unspooled & unwritten)
        return len(lost), (lost[0][0] if lost else None), (lost[-1][0] if lost else None)

    def add(self, step: int, **values: float) -> None:
        """Record metric values of one step."""
        self.add_values(step, values)

    def add_values(self, step: int, values: dict[str, float]) -> None:
        """:meth:`add` for a dict the caller hands over (and no longer changes): no copy of it is made."""
        line = self._metrics_line(step, values)
        with self.lock:
            self._append(line)
            self.pending.append((step, values))

    def update_run(self, **fields: object) -> None:
        """Record bookkeeping columns (step, heartbeat, pid, ...) with the same guarantees.

        A progress mark alone (step, heartbeat) goes to the OS with the next flushed line, not on its
        own: a kill loses at most the newest mark, which the run's metric lines and checkpoint also
        give, and the training thread saves a system call a step.
        """
        line = spool.fields_line(self.run_id, fields)
        with self.lock:
            self._append(line, flush=not fields.keys() <= PROGRESS)
            self.fields.update(fields)
            if self.snapshot:
                self.snapshot.update(fields)

    def progress(self, step: int) -> None:
        """Record the run's newest completed step (``update_run(step=...)``, made cheap: every step calls it)."""
        line = self._step_line(step)
        with self.lock:
            self._append(line, flush=False)
            self.fields["step"] = step
            if self.snapshot:
                self.snapshot["step"] = step

    def transition(self, to: str, **fields: object) -> None:
        """Record that the trainer moved its run to ``to`` (with columns that go with the change)."""
        states.sources(states.TRAINER, to)  # a state the trainer may never set fails here, at once
        with self.lock:
            self._append(spool.fields_line(self.run_id, {"status": to, **fields}))
            self.moves.append((to, fields))
            if self.snapshot:
                self.snapshot.update(status=to, **fields)

    def drop_after(self, step: int) -> None:
        """A resumed attempt rewrites what follows ``step``: the recorded values past it are stale.

        (Values are written insert-or-ignore, so the stale ones must go before the new ones come;
        the spool says so too, for a database that is away now.)
        """
        with self.lock:
            self._append(spool.drop_line(self.run_id, step))
            self.pending = [entry for entry in self.pending if entry[0] <= step]
            self.drops.append(step)

    def keep_snapshot(self, row: dict[str, object]) -> None:
        """Keep the run's whole row in the spool, so a lost database can be rebuilt from it."""
        with self.lock:
            self.snapshot = dict(row)
            self._append(spool.snapshot_line(self.run_id, self.snapshot))

    def _flush_spool(self, check: bool = False) -> None:
        """Hand lines still in this process's buffer (progress marks, or lines a full disk did not take) to the
        OS; make a lost spool again (looked at once a second, or now with ``check``)."""
        with self.lock:
            self.file.flush(check)

    def flush(self, timeout: float = 60.0) -> bool:
        """Write everything now; True if the database holds it all.

        A write already under way when this is called may have taken its rows before the last ones came,
        and a database locked by another writer past its busy timeout is a moment's refusal: both are
        written again, until ``timeout``. Any other failure (database gone, read-only) answers at once.
        """
        deadline = time.monotonic() + timeout
        self._flush_spool(check=True)
        while True:
            self.idle.clear()
            self.wake.set()
            self.idle.wait(max(0.0, deadline - time.monotonic()))
            with self.lock:
                left = bool(self.pending or self.fields or self.moves or self.drops)
                failed, transient = self.failures > 0, _transient(self.last_error)
            if not left and not failed:
                return True
            if (failed and not transient) or time.monotonic() >= deadline:
                return False
            if failed:
                time.sleep(min(self.interval, 0.2))

    def close(self, timeout: float = 60.0) -> bool:
        """Write everything, stop, and empty the spool once the database is confirmed to hold it all.

        True if it does; False leaves the spool for ``attnres sync``.
        """
        ok = self.flush(timeout)
        if not ok:
            ok = self._wait_for_disk(timeout)
        self.done.set()
        self.wake.set()
        self.thread.join(timeout)
        self.file.close()
        if ok and self.spool.exists():
            try:
                if self.spool_ok and not self.file.pruned:
                    lifecycle.recover_now(self.engine, self.spool, lock=False)  # confirmed, then emptied
                elif confirm.confirmed(self.engine, [(self.run_id, *self.last_row)]):
                    os.truncate(self.spool, 0)  # a spool the disk cut short: the database has all of it
            except (SQLAlchemyError, OSError, AttnresError) as exc:
                say(f"attnres: {str(exc).splitlines()[0][:300]}", err=True)
                ok = False
        if ok:
            try:  # the run's summaries for reports (after the last write: any write drops them); only a cache
                run_rows.summarize(self.engine, self.run_id)
            except (SQLAlchemyError, OSError):
                pass
        if self.mirror is not None:
            self.mirror.close()  # (what a mirror did not take by then is left to `attnres sync --mirror`)
        return ok

    def _wait_for_disk(self, timeout: float) -> bool:
        """Closing with values that neither the database nor the spool has taken (the disk both are on is full):
        try both again every interval until one takes them, for ``$ATTNRES_DISK_WAIT_S`` at most; what is then
        still in memory is named as lost. True if the database took everything meanwhile.

        A failure that does not pass by itself (a file-size limit, a read-only folder) is not waited for.
        """
        if not self.unkept():
            return False
        held, first, last = self.held_values()
        error = self.file.error
        wait = disk_wait_s() if error is not None and error.errno in PASSING else 0.0
        if wait:
            what = f"{held} value(s) of steps {first}-{last}" if held else "its newest changes"
            say(f"attnres: run {self.run_id}: {what} are held in memory only: neither the database nor the spool "
                f"can be written ({error.strerror}); trying both again every {self.interval:g} s for up to "
                f"{wait:g} s ($ATTNRES_DISK_WAIT_S)", err=True)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(self.interval)
            self._flush_spool(check=True)
            if self.flush(timeout):
                return True
            if self.spool_ok:
                return False  # the spool has everything now: `attnres sync` writes it
        held, first, last = self.held_values()
        if self.unkept():
            what = f"{held} value(s) of steps {first}-{last}" + (" and its end" if self.moves else "") if held else (
                "its end" if self.moves else "its newest bookkeeping (step, heartbeat)")
            say(f"attnres: run {self.run_id}: {what} could not be written anywhere "
                f"({(error.strerror if error is not None else None) or error}) and are lost; the database and "
                f"{self.spool} hold what came before them", err=True)
        return False

    def unkept(self) -> bool:
        """Whether something the database lacks is held in memory only (its spool could not take it either)."""
        with self.lock:
            return (not self.file.ok and bool(self.file.held)
                    and bool(self.pending or self.fields or self.moves or self.drops or self._inflight))

    def lost_values(self) -> int:
        """Values this writer held in memory only when it closed: never written, gone with the process."""
        return self.held_values()[0]

    # -- consumer side (background thread) --------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self.wake.wait(self.interval)
            self.wake.clear()
            self._write_once()
            self.idle.set()
            if self.done.is_set():
                return

    def _write_once(self) -> None:
        # progress marks reach the OS within one interval, whatever the run logs; a lost spool is made again
        self._flush_spool(check=True)
        with self.lock:
            entries, self.pending = self.pending, []
            fields, self.fields = self.fields, {}
            moves, self.moves = self.moves, []
            drops, self.drops = self.drops, []
            self._inflight = (entries, fields, moves, drops)  # a spool made again meanwhile writes these too
        try:
            check_location(self.engine)  # never into a deleted database file that a pooled connection holds
            if self.failures and self.spool.exists() and not self.file.pruned:
                lifecycle.recover_now(self.engine, self.spool, lock=False, truncate=False)  # earlier failures' rows
                if self.mirror is not None:
                    self.mirror.catch_up()
            for step in drops:
                run_rows.drop_metrics_after(self.engine, self.run_id, step)
            run_rows.log_steps(self.engine, self.run_id, entries)
            last = next((entry for entry in reversed(entries) if entry[1]), None)  # the newest step with values
            if last is not None:
                self.last_row = (next(reversed(last[1])), last[0])
            run_rows.update_run(self.engine, self.run_id, **run_rows.parse_times(fields))
            if self.mirror is not None:
                self.mirror.send(entries)
            for to, extra in moves:
                outcome = lifecycle.move(self.engine, self.run_id, to, states.TRAINER, **run_rows.parse_times(extra))
                if not outcome and outcome.status != to:
                    self.refused.append((to, outcome.status))
                if self.mirror is not None:
                    self.mirror.status(outcome.status or to)
        except (SQLAlchemyError, OSError, AttnresError) as exc:
            with self.lock:
                self.pending = entries + self.pending
                self.fields = {**fields, **self.fields}
                self.moves = moves + self.moves
                self.drops = drops + self.drops
                self._inflight = None
            if self.failures == 0:
                kept = (f"spooling to {self.spool}" if self.spool_ok
                        else f"held in memory, as {self.spool} cannot be written either")
                say(f"attnres: database write failed ({str(exc).splitlines()[0][:200]}); {kept}", err=True)
            self.failures += 1
            self.last_error = exc
            return
        with self.lock:
            self.failures = 0
            self._inflight = None
            if not (self.pending or self.fields or self.moves or self.drops):
                self.file.prune()  # the database has all a failing spool holds
