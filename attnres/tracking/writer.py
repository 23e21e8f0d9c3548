"""A metric writer that never blocks or kills training and never loses a recorded value.

Every value and every change of the run is first appended to the run's *spool* (see
:mod:`attnres.tracking.spool`), then written to the database in batches by a background thread. A
"database is locked" error is retried; an unreachable, read-only or deleted database leaves the
rows in the spool, and the next successful write (or ``attnres sync``) ingests them. The spool is
emptied only when everything in it is in the database.

The writer speaks for the trainer: its state changes go through :mod:`attnres.tracking.states`
as the ``trainer`` actor, so a run killed or failed meanwhile keeps that end.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from attnres.errors import AttnresError
from attnres.tracking import spool, states, store


def _sqlite_file(engine: Engine) -> Path | None:
    if engine.dialect.name != "sqlite" or not engine.url.database or engine.url.database == ":memory:":
        return None
    return Path(engine.url.database)


class MetricWriter:
    """Buffered, background, spool-backed writer of one run's metrics and state."""

    def __init__(self, engine: Engine, run_id: int, spool_path: Path, interval: float = 2.0) -> None:
        self.engine, self.run_id, self.spool, self.interval = engine, run_id, Path(spool_path), interval
        self.db_file = _sqlite_file(engine)
        self.lock = threading.Lock()
        self.pending: list[tuple[int, str, float]] = []
        self.fields: dict[str, object] = {}  # bookkeeping columns, latest value wins
        self.moves: list[tuple[str, dict[str, object]]] = []  # state changes, in order
        self.snapshot: dict[str, object] = {}  # the whole run row, kept at the spool's head
        self.refused: list[tuple[str, str | None]] = []  # (asked, what the run was): an end decided elsewhere
        self.spool_ok = True
        self.failures = 0
        self.wake = threading.Event()
        self.done = threading.Event()
        self.idle = threading.Event()
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        self._fh = None
        self.thread = threading.Thread(target=self._loop, name="attnres-metric-writer", daemon=True)
        self.thread.start()

    # -- producer side (training thread) ----------------------------------------------------------
    def _append(self, line: str) -> None:
        if not self.spool_ok:
            return
        try:
            if self._fh is None:
                self._fh = self.spool.open("a", encoding="utf-8")
            self._fh.write(line)
            self._fh.flush()  # into the OS: survives SIGKILL of this process
        except OSError as exc:  # disk full, unwritable folder: keep rows in memory, keep training
            self.spool_ok = False
            print(f"attnres: cannot write spool {self.spool} ({exc.strerror}); metrics kept in memory",
                  file=sys.stderr, flush=True)

    def add(self, step: int, **values: float) -> None:
        """Record metric values of one step."""
        with self.lock:
            for key, value in values.items():
                self._append(spool.metric_line(self.run_id, step, key, value))
                self.pending.append((step, key, value))

    def update_run(self, **fields: object) -> None:
        """Record bookkeeping columns (step, heartbeat, pid, ...) with the same guarantees."""
        with self.lock:
            self._append(spool.fields_line(self.run_id, fields))
            self.fields.update(fields)
            if self.snapshot:
                self.snapshot.update(fields)

    def transition(self, to: str, **fields: object) -> None:
        """Record that the trainer moved its run to ``to`` (with columns that go with the change)."""
        states.sources(states.TRAINER, to)  # a state the trainer may never set fails here, at once
        with self.lock:
            self._append(spool.fields_line(self.run_id, {"status": to, **fields}))
            self.moves.append((to, fields))
            if self.snapshot:
                self.snapshot.update(status=to, **fields)

    def keep_snapshot(self, row: dict[str, object]) -> None:
        """Keep the run's whole row in the spool, so a lost database can be rebuilt from it."""
        with self.lock:
            self.snapshot = dict(row)
            self._append(spool.snapshot_line(self.run_id, self.snapshot))

    def flush(self, timeout: float = 60.0) -> bool:
        """Write everything now; True if the database holds it all."""
        self.idle.clear()
        self.wake.set()
        self.idle.wait(timeout)
        with self.lock:
            return not self.pending and not self.fields and not self.moves and self.failures == 0

    def close(self, timeout: float = 60.0) -> bool:
        ok = self.flush(timeout)
        self.done.set()
        self.wake.set()
        self.thread.join(timeout)
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:  # the disk filled under the last buffered line: it is still in memory
                pass
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
        with self.lock:
            rows, self.pending = self.pending, []
            fields, self.fields = self.fields, {}
            moves, self.moves = self.moves, []
        try:
            if self.db_file is not None and not self.db_file.exists():
                raise OSError(f"database file {self.db_file} is gone")
            if self.failures and self.spool.exists():
                spool.ingest(self.engine, self.spool, truncate=False)  # what earlier failures left
            store.log_metrics(self.engine, self.run_id, rows)
            store.update_run(self.engine, self.run_id, **store.parse_times(fields))
            for to, extra in moves:
                outcome = states.transition(self.engine, self.run_id, to, states.TRAINER, **store.parse_times(extra))
                if not outcome and outcome.status != to:
                    self.refused.append((to, outcome.status))
        except (SQLAlchemyError, OSError, AttnresError) as exc:
            with self.lock:
                self.pending = rows + self.pending
                self.fields = {**fields, **self.fields}
                self.moves = moves + self.moves
            if self.failures == 0:
                print(f"attnres: database write failed ({str(exc).splitlines()[0][:200]}); "
                      f"spooling to {self.spool}", file=sys.stderr, flush=True)
            self.failures += 1
            return
        with self.lock:
            self.failures = 0
            if not self.pending and not self.fields and not self.moves and self.spool_ok and self._fh is not None:
                self._fh.truncate(0)  # all of it is in the database now ...
                self._fh.seek(0)
                if self.snapshot:  # ... but keep what rebuilds the run should the database be lost
                    self._append(spool.snapshot_line(self.run_id, self.snapshot))
