"""A run's spool: the append-only JSONL write-ahead log of its metric writer, and its one reader.

The trainer's writer appends every value and every change of its run to the spool before the
database sees it, so whatever the database misses (locked, unreachable, read-only, deleted) is
still on disk. :func:`ingest` is the only code that reads a spool back into the database; the
writer (retrying), the queue (when a trainer exits) and ``attnres sync`` all call it.

Lines, one JSON object each::

    {"r": RUN, "s": STEP, "k": KEY, "v": VALUE}     a metric value
    {"run": RUN, "fields": {...}}                    bookkeeping columns (step, heartbeat, ...)
    {"run": RUN, "fields": {"status": S, ...}}       the trainer moved its run to S (states.TRAINER)
    {"run": RUN, "snapshot": {...}}                  the whole run row: recreates a lost run

Metric rows are unique per (run, key, step), so ingesting a spool twice records each value once;
state changes go through :func:`attnres.tracking.states.transition`, so replaying an old
"running" can never reopen a run that has ended since.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine

from attnres.errors import AttnresError
from attnres.tracking import states, store

BATCH = 5000


def metric_line(run_id: int, step: int, key: str, value: float) -> str:
    return json.dumps({"r": run_id, "s": step, "k": key, "v": value}) + "\n"


def fields_line(run_id: int, fields: dict[str, object]) -> str:
    return json.dumps({"run": run_id, "fields": _jsonable(fields)}) + "\n"


def snapshot_line(run_id: int, row: dict[str, object]) -> str:
    return json.dumps({"run": run_id, "snapshot": _jsonable(row)}) + "\n"


def _jsonable(fields: dict[str, object]) -> dict[str, object]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in fields.items()}


@dataclass
class _RunLog:
    """What a spool says of one run, in order."""

    updates: list[dict[str, object]] = field(default_factory=list)
    snapshot: dict[str, object] | None = None
    metrics: list[tuple[int, str, float]] = field(default_factory=list)


def read(spool: Path) -> tuple[dict[int, _RunLog], int]:
    """Parse a spool: per-run logs, and how many lines were unreadable (skipped)."""
    runs: dict[int, _RunLog] = {}
    bad = 0
    with Path(spool).open("rb") as fh:
        for raw in fh:
            try:
                obj = json.loads(raw.decode("utf-8"))
                if "r" in obj:
                    runs.setdefault(int(obj["r"]), _RunLog()).metrics.append(
                        (int(obj["s"]), str(obj["k"]), float(obj["v"])))
                elif "snapshot" in obj:
                    log = runs.setdefault(int(obj["run"]), _RunLog())
                    log.snapshot = {**(log.snapshot or {}), **dict(obj["snapshot"])}
                else:
                    runs.setdefault(int(obj["run"]), _RunLog()).updates.append(dict(obj["fields"]))
            except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
                bad += 1  # a line cut short by a crash, or garbled: its value was never acknowledged
    return runs, bad


def ingest(engine: Engine, spool: Path, truncate: bool = True) -> dict[str, int]:
    """Write a spool's metrics and run changes into the database (idempotent); empty it after.

    Returns counts: ``rows`` (metric values given), ``runs`` (runs recreated from a snapshot),
    ``skipped`` (unreadable lines).
    """
    spool = Path(spool)
    if not spool.exists():
        return {"rows": 0, "runs": 0, "skipped": 0}
    runs, bad = read(spool)
    created = 0
    for run_id, log in runs.items():
        if store.status_of(engine, run_id) is None:
            if log.snapshot is None:
                if log.metrics or log.updates:
                    raise AttnresError(f"spool {spool} holds run {run_id}, which this database lacks, "
                                       "and no snapshot of it")
                continue
            _restore(engine, run_id, log)
            created += 1
        else:
            _replay(engine, run_id, log.updates)
    rows = 0
    for run_id, log in runs.items():
        for start in range(0, len(log.metrics), BATCH):
            rows += store.log_metrics(engine, run_id, log.metrics[start:start + BATCH])
    if truncate:
        os.truncate(spool, 0)
    return {"rows": rows, "runs": created, "skipped": bad}


def _restore(engine: Engine, run_id: int, log: _RunLog) -> None:
    """Recreate a run whose row the database lost: its snapshot, then every change after it."""
    row = dict(log.snapshot or {})
    for update in log.updates:
        row.update(update)
    row = store.parse_times(row)
    row.pop("id", None)
    states.create(engine, states.RESTORER, str(row.pop("status")), id=run_id, **row)


def _replay(engine: Engine, run_id: int, updates: list[dict[str, object]]) -> None:
    """Apply a run's spooled changes in order: columns as they come, states through the machine."""
    pending: dict[str, object] = {}
    for update in updates:
        update = store.parse_times(update)
        if "status" not in update:
            pending.update(update)
            continue
        store.update_run(engine, run_id, **pending)
        pending = {}
        to = str(update.pop("status"))
        states.transition(engine, run_id, to, states.TRAINER, **update)  # refused if decided elsewhere
    store.update_run(engine, run_id, **pending)
