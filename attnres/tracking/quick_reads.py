"""The reads that must answer at once (``attnres status``), as plain SQL, on a read-only SQLite connection.

``attnres status`` lists runs and their latest values: a few statements. SQLAlchemy's import alone was ~0.3 s of
the command's ~0.65 s on a 2-core machine, so over a SQLite file whose schema is this attnres's the statements
run on a stdlib ``sqlite3`` connection opened read-only (``mode=ro``: the file cannot be written through it,
whatever a bug asks). Anywhere else (PostgreSQL; a file that is older, newer, half-upgraded or not ours, whose
message is the engine's to give) the same statement text runs through the store's engine: named parameters
(``:name``) are both sqlite3's and SQLAlchemy ``text()``'s, so each statement is written once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Protocol

from attnres.tracking.urls import HEAD, sqlite_file

if TYPE_CHECKING:
    from sqlalchemy import Engine

Params = Mapping[str, object]


class Reads(Protocol):
    """Where the statements of :mod:`attnres.tracking.status_reads` and :mod:`~attnres.tracking.completeness` run."""

    def all(self, sql: str, params: Params | None = None) -> list[tuple]:
        """The rows of one SELECT, as tuples."""
        ...

    def batch(self) -> AbstractContextManager[None]:
        """Statements run meanwhile share one connection (a loop of lookups: one checkout, not one each)."""
        ...


class EngineReads:
    """The statements through an engine (any database SQLAlchemy opens)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn = None

    @contextmanager
    def batch(self) -> Iterator[None]:
        if self._conn is not None:  # (inside another batch: its connection)
            yield
            return
        with self._engine.connect() as conn:  # (on PostgreSQL a checkout pings the server: once, not per lookup)
            self._conn = conn
            try:
                yield
            finally:
                self._conn = None

    def all(self, sql: str, params: Params | None = None) -> list[tuple]:
        from sqlalchemy import text

        with self.batch():
            return [tuple(r) for r in self._conn.execute(text(sql), dict(params or {})).all()]


class SqliteReads:
    """The statements on a read-only stdlib connection to a SQLite file. A failure (a lock held past the wait, a
    file gone) is raised as the engine's would be, so callers catch one kind of database error."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def all(self, sql: str, params: Params | None = None) -> list[tuple]:
        try:
            return self._conn.execute(sql, dict(params or {})).fetchall()
        except sqlite3.Error as exc:
            from sqlalchemy.exc import OperationalError  # (a failure's path only)

            raise OperationalError(sql, dict(params or {}), exc) from None

    def batch(self) -> AbstractContextManager[None]:
        return nullcontext()  # (one connection already)

    def close(self) -> None:
        self._conn.close()


def open_sqlite(url: str, busy_s: float) -> SqliteReads | None:
    """A read-only connection to the SQLite file of ``url`` (normalized), if it is one whose schema is this
    attnres's; None otherwise (not a plain file, no file, or a file the engine must judge), and the caller opens
    the engine. ``busy_s``: how long a statement waits for a writer's lock."""
    path = sqlite_file(url)
    if path is None or not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=busy_s, check_same_thread=False)
    except sqlite3.Error:
        return None
    tables: set[str] = set()
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rev = conn.execute("SELECT version_num FROM alembic_version").fetchall() if "alembic_version" in tables else []
    except sqlite3.Error:
        rev = []  # (a lock held past the wait, a file that is not a database: the engine says which)
    if "runs" not in tables or rev != [(HEAD,)]:  # (the engine's checks say what is wrong, or upgrade it)
        conn.close()
        return None
    return SqliteReads(conn)


def in_list(name: str, values: Sequence[object]) -> tuple[str, dict[str, object]]:
    """``:name0, :name1, ...`` and their parameters, for ``IN (...)`` (an empty list matches nothing)."""
    if not values:
        return "NULL", {}
    return ", ".join(f":{name}{i}" for i in range(len(values))), {f"{name}{i}": v for i, v in enumerate(values)}
