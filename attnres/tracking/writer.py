"""A metric writer that never blocks or kills training and never loses a recorded value.

Every row is first appended to the run's *spool* (an append-only JSONL write-ahead log beside its
log file), then written to the database in batches by a background thread. A "database is
locked" error is retried; an unreachable, read-only or deleted database leaves the rows in the
spool, and the next successful write (or ``attnres sync``) ingests them. Rows are unique per
(run, key, step), so ingesting a spool twice records each value once. The spool is emptied only
when everything in it is in the database.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from attnres.errors import AttnresError
from attnres.tracking import store
from attnres.tracking.schema import ACTIVE, Run


def _sqlite_file(engine: Engine) -> Path | None:
    if engine.dialect.name != "sqlite" or not engine.url.database or engine.url.database == ":memory:":
        return None
    return Path(engine.url.database)


class MetricWriter:
    """Buffered, background, spool-backed writer of one run's metrics and state."""

    def __init__(self, engine: Engine, run_id: int, spool: Path, interval: float = 2.0) -> None:
        self.engine, self.run_id, self.spool, self.interval = engine, run_id, Path(spool), interval
        self.db_file = _sqlite_file(engine)
        self.lock = threading.Lock()
        self.pending: list[tuple[int, str, float]] = []
        self.state: dict[str, object] = {}
        self.snapshot: dict[str, object] = {}  # the whole run row, kept at the spool's head
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
    def _append(self, obj: dict) -> None:
        if not self.spool_ok:
            return
        try:
            if self._fh is None:
                self._fh = self.spool.open("a", encoding="utf-8")
            self._fh.write(json.dumps(obj) + "\n")
            self._fh.flush()  # into the OS: survives SIGKILL of this process
        except OSError as exc:  # disk full, unwritable folder: keep rows in memory, keep training
            self.spool_ok = False
            print(f"attnres: cannot write spool {self.spool} ({exc.strerror}); metrics kept in memory",
                  file=sys.stderr, flush=True)

    def add(self, step: int, **values: float) -> None:
        with self.lock:
            for key, value in values.items():
                self._append({"r": self.run_id, "s": step, "k": key, "v": value})
                self.pending.append((step, key, value))

    def update_run(self, **fields: object) -> None:
        """Record run-state changes (status, step, heartbeat) with the same guarantees."""
        fields = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in fields.items()}
        with self.lock:
            self._append({"run": self.run_id, "fields": fields})
            self.state.update(fields)
            if "config_json" in fields or self.snapshot:
                self.snapshot.update(fields)

    def flush(self, timeout: float = 60.0) -> bool:
        """Write everything now; True if the database holds it all."""
        self.idle.clear()
        self.wake.set()
        self.idle.wait(timeout)
        with self.lock:
            return not self.pending and not self.state and self.failures == 0

    def close(self, timeout: float = 60.0) -> bool:
        ok = self.flush(timeout)
        self.done.set()
        self.wake.set()
        self.thread.join(timeout)
        if self._fh is not None:
            self._fh.close()
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
            state, self.state = self.state, {}
        try:
            if self.db_file is not None and not self.db_file.exists():
                raise OSError(f"database file {self.db_file} is gone")
            if self.failures and self.spool.exists():
                ingest_spool(self.engine, self.spool, truncate=False)  # what earlier failures left
            store.log_metrics(self.engine, self.run_id, rows)
            if state:
                store.update_run(self.engine, self.run_id, **_respecting_kill(self.engine, self.run_id, state))
        except (SQLAlchemyError, OSError, AttnresError) as exc:
            with self.lock:
                self.pending = rows + self.pending
                self.state = {**state, **self.state}
            if self.failures == 0:
                print(f"attnres: database write failed ({str(exc).splitlines()[0][:200]}); "
                      f"spooling to {self.spool}", file=sys.stderr, flush=True)
            self.failures += 1
            return
        with self.lock:
            self.failures = 0
            if not self.pending and not self.state and self.spool_ok and self._fh is not None:
                self._fh.truncate(0)  # all of it is in the database now ...
                self._fh.seek(0)
                if self.snapshot:  # ... but keep what rebuilds the run should the database be lost
                    self._append({"run": self.run_id, "fields": self.snapshot})


def _respecting_kill(engine: Engine, run_id: int, fields: dict[str, object]) -> dict[str, object]:
    """A run the user killed stays killed, whatever the dying run reports (e.g. 'preempted')."""
    with Session(engine) as s:
        current = s.scalar(select(Run.status).where(Run.id == run_id))
    if current == "killed":
        fields = {k: v for k, v in fields.items() if k not in {"status", "message", "ended_at"}}
    return store.parse_times(fields)


def ingest_spool(engine: Engine, spool: Path, truncate: bool = True) -> dict[str, int]:
    """Write a spool's rows and run states into the database (idempotent); empty it after."""
    spool = Path(spool)
    if not spool.exists():
        return {"rows": 0, "runs": 0}
    metrics: dict[int, list[tuple[int, str, float]]] = {}
    states: dict[int, dict[str, object]] = {}
    with spool.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash: its value was never acknowledged
            if "run" in obj:
                states.setdefault(int(obj["run"]), {}).update(obj["fields"])
            else:
                metrics.setdefault(int(obj["r"]), []).append((int(obj["s"]), obj["k"], float(obj["v"])))
    created = 0
    for run_id, fields in states.items():
        with Session(engine) as s:
            status = s.scalar(select(Run.status).where(Run.id == run_id))
        if status is not None:
            if status not in ACTIVE and fields.get("status") in ACTIVE:
                fields = {k: v for k, v in fields.items() if k != "status"}  # an end decided elsewhere wins
            store.update_run(engine, run_id, **_respecting_kill(engine, run_id, fields))
        elif "config_json" in fields:  # the database was replaced: recreate the run from the spool
            with Session(engine) as s:
                s.add(Run(id=run_id, **store.parse_times(fields)))
                s.commit()
            created += 1
    rows = 0
    for run_id, items in metrics.items():
        with Session(engine) as s:
            if s.scalar(select(Run.id).where(Run.id == run_id)) is None:
                raise AttnresError(f"spool {spool} holds metrics of run {run_id}, which this database lacks")
        for start in range(0, len(items), 5000):
            rows += store.log_metrics(engine, run_id, items[start:start + 5000])
    if truncate:
        os.truncate(spool, 0)
    return {"rows": rows, "runs": created}
