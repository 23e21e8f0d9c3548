"""The raw-database anchor of ``attnres bench tracker``: the same rows inserted by sqlite3 alone.

What the tracker's own ingest is measured against, in the same run: the driver's ``executemany``
of ready-made tuples into the same schema, one transaction, nothing else.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path


def raw_sqlite_insert_s(db: Path, keys: Sequence[str], rows: Sequence[tuple[int, int, int, float]]) -> float:
    """Seconds for sqlite3 to insert ``rows`` (run, key id, step, value) into ``db``'s metrics table, the
    keys (ids 1..n) put in first and not timed."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executemany("INSERT OR IGNORE INTO metric_keys (id, name) VALUES (?, ?)", list(enumerate(keys, 1)))
        conn.commit()
        t0 = time.perf_counter()
        conn.executemany("INSERT OR IGNORE INTO metrics (run_id, key_id, step, value) VALUES (?, ?, ?, ?)", rows)
        conn.commit()
        return time.perf_counter() - t0
    finally:
        conn.close()
