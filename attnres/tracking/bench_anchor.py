"""The raw-database anchor of ``attnres bench tracker`` (the same rows inserted by sqlite3 alone), and the
scratch PostgreSQL database its paper-scale measure fills.

What the tracker's own ingest is measured against, in the same run: the driver's ``executemany``
of ready-made tuples into the same schema, one transaction, nothing else.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from attnres.errors import AttnresError


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


def check_server(server: str) -> None:
    """One line (:class:`AttnresError`) unless ``server`` is a PostgreSQL URL: checked before any measure, so that a
    wrong ``--server`` loses none."""
    from sqlalchemy.engine import make_url

    driver = make_url(server).drivername
    if not driver.startswith("postgresql"):
        raise AttnresError(f"bench tracker: --server must be a PostgreSQL URL (postgresql+psycopg://...), not {driver}")


@contextmanager
def scratch_database(server: str, prefix: str = "attnres_bench") -> Iterator[str]:
    """A new, empty database on the PostgreSQL server of ``server`` (a URL naming any database on it) for the
    time of the ``with``, dropped after: the bench (and each PostgreSQL test) fills it without touching what the
    named database holds."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(server).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
