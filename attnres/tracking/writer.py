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
and everything the database has not confirmed yet; one that cannot be made again (a read-only or
full disk) leaves the rows in memory, and training goes on.

The writer speaks for the trainer: its state changes go through :mod:`attnres.tracking.states`
as the ``trainer`` actor, so a run killed or failed meanwhile keeps that end.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from attnres.errors import AttnresError
from attnres.logline import say
from attnres.tracking import confirm, lifecycle, spool, states, store
from attnres.tracking.db import check_location


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _transient(exc: Exception | None) -> bool:
    """A write refused for a moment: the database locked by another writer (SQLite) past the busy timeout."""
    return isinstance(exc, OperationalError) and any(w in str(exc).lower() for w in ("locked", "busy"))


PROGRESS = frozenset({"step", "heartbeat_at"})  # bookkeeping a later line's flush may carry to the OS
SPOOL_CHECK_S = 1.0  # how often a write looks whether its spool is still at its path (deleted, replaced)


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
        self.spool_ok = True
        self.failures = 0
        self.last_error: Exception | None = None  # of the last failed write (a lock is worth another try)
        self.wake = threading.Event()
        self.done = threading.Event()
        self.idle = threading.Event()
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        self._metrics_line, self._step_line = spool.line_makers(run_id)
        self._fd: int | None = None  # the spool, opened at the first line
        self._held: list[str] = []  # lines not yet handed to the OS (progress marks), in order
        self._next_check = 0.0  # (monotonic) when a write next looks whether the spool is still there
        # what the background thread is writing to the database now: neither pending nor confirmed
        self._inflight: tuple[list, dict, list, list] | None = None
        self.thread = threading.Thread(target=self._loop, name="attnres-metric-writer", daemon=True)
        self.thread.start()

    # -- producer side (training thread) ----------------------------------------------------------
    def _append(self, line: str, flush: bool = True) -> None:
        """Append a line to the spool; ``flush`` hands it (and the lines held before it) to the OS now.

        One ``os.write`` on an unbuffered descriptor: what reached the OS survives a SIGKILL of this
        process, and there is no buffered layer to flush (half the cost of a logged step, measured).
        """
        if not self.spool_ok:
            return
        self._held.append(line)
        if flush:
            self._write_held()

    def _write_held(self, check: bool = False) -> None:
        data, self._held = "".join(self._held).encode(), []
        self._write(data, check)

    def _write(self, data: bytes, check: bool = False) -> None:
        """Hand ``data`` to the spool (under ``self.lock``); a spool deleted or replaced is made again first.

        Whether the file is still at its path is looked at once a second (``check`` forces it), not per line.
        """
        try:
            if self._fd is not None and self._moved(check):
                data = self._recreate() + data
            if self._fd is None:
                self.spool.parent.mkdir(parents=True, exist_ok=True)  # (a logs folder deleted before the first line)
                fd = os.open(self.spool, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    if os.fstat(fd).st_size and not _ends_with_newline(self.spool):  # an earlier attempt was cut
                        data = b"\n" + data
                except OSError:
                    os.close(fd)
                    raise
                self._fd = fd
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as exc:  # disk full, unwritable or read-only folder: keep rows in memory, keep training
            self._spool_failed(exc)

    def _moved(self, now: bool = False) -> bool:
        """Whether the open spool is no longer the file at its path (deleted, its folder deleted, replaced).

        Looked at once every ``SPOOL_CHECK_S`` (a ``stat`` and an ``fstat``), or ``now``.
        """
        clock = time.monotonic()
        if not now and clock < self._next_check:
            return False
        self._next_check = clock + SPOOL_CHECK_S
        try:
            there = os.stat(self.spool)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:  # cannot tell (a folder unreadable for a moment): keep writing where we write
            return False
        mine = os.fstat(self._fd)
        return (there.st_ino, there.st_dev) != (mine.st_ino, mine.st_dev)

    def _recreate(self) -> bytes:
        """Leave a spool that is gone from its path; the lines that make the next one hold, alone, everything
        the database may lack: the run's row (snapshot), then what is being written to the database now and
        what waits to be, in order (resume points, values, columns, state changes).

        Values the database already took are not written again, and neither are its confirmed resume points
        (replayed, they would drop this attempt's confirmed values past them).
        """
        try:
            os.close(self._fd)
        except OSError:  # (a delayed write error of the lost file: what it held is rewritten below)
            pass
        self._fd = None
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
        say(f"attnres: spool {self.spool} was deleted or replaced; made it again with the {values} value(s) "
            "the database has not confirmed yet", err=True)
        return "".join(lines).encode()

    def _spool_failed(self, exc: OSError) -> None:
        self.spool_ok = False
        say(f"attnres: cannot write spool {self.spool} ({exc.strerror}); metrics kept in memory", err=True)

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
        """Hand lines still in this process's buffer (progress marks) to the OS; make a lost spool again
        (looked at once a second, or now with ``check``)."""
        with self.lock:
            if self.spool_ok and (self._held or self._fd is not None):
                self._write_held(check)

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
        self.done.set()
        self.wake.set()
        self.thread.join(timeout)
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:  # a delayed write error (NFS): what it held is in memory and in the database
                pass
            self._fd = None
        if ok and self.spool.exists():
            try:
                if self.spool_ok:
                    lifecycle.recover_now(self.engine, self.spool, lock=False)  # confirmed, then emptied
                elif confirm.confirmed(self.engine, [(self.run_id, *self.last_row)]):
                    os.truncate(self.spool, 0)  # a spool the disk cut short: the database has all of it
            except (SQLAlchemyError, OSError, AttnresError) as exc:
                say(f"attnres: {str(exc).splitlines()[0][:300]}", err=True)
                ok = False
        if ok:
            try:  # the run's summaries for reports (after the last write: any write drops them); only a cache
                store.summarize(self.engine, self.run_id)
            except (SQLAlchemyError, OSError):
                pass
        if self.mirror is not None:
            self.mirror.close()  # (what a mirror did not take by then is left to `attnres sync --mirror`)
        return ok

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
            if self.failures and self.spool.exists():
                lifecycle.recover_now(self.engine, self.spool, lock=False, truncate=False)  # earlier failures' rows
                if self.mirror is not None:
                    self.mirror.catch_up()
            for step in drops:
                store.drop_metrics_after(self.engine, self.run_id, step)
            store.log_steps(self.engine, self.run_id, entries)
            last = next((entry for entry in reversed(entries) if entry[1]), None)  # the newest step with values
            if last is not None:
                self.last_row = (next(reversed(last[1])), last[0])
            store.update_run(self.engine, self.run_id, **store.parse_times(fields))
            if self.mirror is not None:
                self.mirror.send(entries)
            for to, extra in moves:
                outcome = lifecycle.move(self.engine, self.run_id, to, states.TRAINER, **store.parse_times(extra))
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
                say(f"attnres: database write failed ({str(exc).splitlines()[0][:200]}); spooling to {self.spool}",
                    err=True)
            self.failures += 1
            self.last_error = exc
            return
        with self.lock:
            self.failures = 0
            self._inflight = None
