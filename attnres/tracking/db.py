"""Opening the tracking database: URL parsing, SQLite pragmas, schema creation and checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from attnres.errors import AttnresError
from attnres.tracking.urls import (  # noqa: F401 - re-exported: where the database is
    HEAD,
    busy_timeout_s,
    default_url,
    exists,
    normalize_url,
    public_url,
    sqlite_path,
)

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig


def _sqlite_pragmas(busy_s: float) -> Callable[..., None]:
    # NORMAL is durable at WAL checkpoints and 10x faster than FULL; a long busy timeout turns lock
    # contention into waiting. WAL itself is persistent: set once the schema is known to be ours.
    def on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001 - DB-API connection
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_s * 1000)}")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    return on_connect


def get_engine(db: str | None = None, create: bool = True, busy_s: float | None = None) -> Engine:
    """An engine with the schema in place; a clear error for unusable databases.

    ``create=False`` opens read-only use: a missing SQLite file is an error, not a new file.
    ``busy_s`` is how long a SQLite statement waits for another process's lock (default
    ``$ATTNRES_DB_BUSY_TIMEOUT``, 60 s); a command that must answer at once gives less.
    One engine per database, resolved now: the default (``$ATTNRES_DB``) and relative paths name
    another file after a change of folder or environment, and must not reuse the first one's engine.
    """
    key = (normalize_url(db), db, create, busy_timeout_s() if busy_s is None else busy_s)
    if key not in _ENGINES:  # (one that cannot be made raises, and is asked for again next time)
        _ENGINES[key] = _engine(*key)
    return _ENGINES[key]


# the engines made so far, by URL, as given, create and busy_s: the one place they are kept, so that
# forget_engines can close them
_ENGINES: dict[tuple[str, str | None, bool, float], Engine] = {}


def forget_engines() -> None:
    """Drop every engine made so far and close their pooled connections: after an upgrade changed the schema
    they checked, and in a process that goes on past the databases it opened (a pooled SQLite connection
    keeps its file open, and its write-ahead log from being folded back, until it is closed). An engine still
    held elsewhere stays usable: it opens new connections."""
    while _ENGINES:
        engine = _ENGINES.popitem()[1]
        _FILES.pop(id(engine), None)  # (its id may be a new engine's next)
        engine.dispose()


def _engine(url: str, db: str | None, create: bool, busy_s: float) -> Engine:
    is_sqlite = url.startswith("sqlite")
    if is_sqlite and not create:
        path = Path(url.split("///", 1)[1])
        if not path.exists():
            raise AttnresError(f"no database at '{path}': launch a run first, or pass --db")
    kwargs = {"connect_args": {"timeout": busy_s}} if is_sqlite else {"pool_pre_ping": True}
    try:
        engine = create_engine(url, **kwargs)
    except (ArgumentError, ImportError) as exc:
        raise AttnresError(f"cannot use database '{db}': {exc}") from None
    if is_sqlite:
        event.listen(engine, "connect", _sqlite_pragmas(busy_s))
    try:
        _check_schema(engine, create, url, db or default_url())
    except (DatabaseError, OperationalError) as exc:
        msg = str(exc.orig).splitlines()[0] if exc.orig else str(exc)
        raise AttnresError(f"cannot open database '{db or default_url()}': {msg}") from None
    if is_sqlite:
        _FILES[id(engine)] = _identity(Path(url.split("///", 1)[1]))
    return engine


# -- where a SQLite engine really writes ---------------------------------------------------------------
# A pooled SQLite connection keeps its file open: if the file is deleted or replaced, writes go on
# into the unlinked file, and are lost. Writers check the file at the configured path first.
_FILES: dict[int, tuple[int, int] | None] = {}


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def db_identity(engine: Engine) -> tuple[int, int] | None:
    """The (device, inode) of a SQLite engine's file as last checked (None for a server database)."""
    return _FILES.get(id(engine))


def check_location(engine: Engine) -> None:
    """Raise OSError when a SQLite engine's file is gone; a replaced file drops the pool's connections
    (so they open the file now at the path) and is taken as the engine's file from here on."""
    if engine.dialect.name != "sqlite" or id(engine) not in _FILES:
        return
    now = _identity(Path(engine.url.database))
    if now is None:
        raise OSError(f"database file {engine.url.database} is gone")
    if now != _FILES[id(engine)]:
        engine.dispose()
        _FILES[id(engine)] = now


# What each revision adds that can be seen in a SQLite file: columns of ``runs``, and tables or indexes (by
# name); a new migration adds its line. An upgrade by an earlier attnres committed the first migration's
# leading DDL at once (pysqlite ran it outside the transaction): a file killed then holds objects of a
# revision it is not stamped with, which `db upgrade` drops and makes again, and other commands refuse.
_ADDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "0002": (("backend", "agent_pid", "job_id", "rule_json"), ()),
    "0003": ((), ("ux_runs_active_config",)),
    "0004": (("experiment", "device"), ("depth_weights", "ix_runs_experiment")),
    "0005": ((), ("metric_summaries",)),
    "0006": (("mirrors_json", "on_end_json"), ("mirror_marks",)),
    "0007": (("launch_id",), ("launches",)),
    "0008": (("conditions_json",), ("benchmarks", "ix_benchmarks_session")),
    "0009": (("queue_host", "queue_pid", "queue_since"), ()),
    "0010": (("placement_json",), ()),
    "0011": ((), ("studies", "ix_studies_command_key")),
}


def _alembic(conn: Connection) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig  # (imported when a schema is made or migrated: not for status)

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.attributes["connection"] = conn
    return cfg


def _ddl_engine(url: str, busy_s: float) -> Engine:
    """An engine whose transactions hold DDL too. pysqlite, left alone, begins a transaction only before
    INSERT/UPDATE/DELETE and runs CREATE/ALTER/DROP before it in autocommit: a schema change killed half
    way stays half done. Here pysqlite begins nothing, and each transaction is one ``BEGIN IMMEDIATE``
    (the write lock at once: no writer changes the file between the checks and the change)."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)  # (PostgreSQL's DDL is transactional as it is)
    engine = create_engine(url, connect_args={"timeout": busy_s})
    pragmas = _sqlite_pragmas(busy_s)

    def on_connect(dbapi_conn, record) -> None:  # noqa: ANN001 - DB-API connection and pool record
        pragmas(dbapi_conn, record)
        dbapi_conn.isolation_level = None

    event.listen(engine, "connect", on_connect)
    event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    return engine


def _wal(engine: Engine) -> None:
    """WAL lets readers (status, reports) run beside writers; it is a property of the file (set outside
    any transaction: a raw connection, as an engine of :func:`_ddl_engine` begins one for any statement)."""
    if engine.dialect.name == "sqlite":
        raw = engine.raw_connection()
        try:
            cur = raw.cursor()
            if cur.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            cur.close()
        finally:
            raw.close()


def _read_revision(conn: Connection) -> tuple[str | None, bool]:
    """(revision, unstamped): Alembic's revision, "0001" for a pre-Alembic attnres file, None if empty;
    ``unstamped`` when an ``alembic_version`` table is there but empty (left by an interrupted upgrade)."""
    tables = set(inspect(conn).get_table_names())
    if tables and "runs" not in tables:
        raise AttnresError("database has tables but is not an attnres database; pass another --db")
    if "alembic_version" not in tables:
        return ("0001" if "runs" in tables else None), False
    rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return ("0001", True) if rev is None else (rev, False)


def revision(engine: Engine) -> str | None:
    """The database's schema revision: Alembic's, "0001" for a pre-Alembic attnres file, None if empty."""
    with engine.connect() as conn:
        return _read_revision(conn)[0]


def _later_objects(conn: Connection, rev: str) -> dict[str, list[tuple[str, str]]]:
    """What a SQLite file stamped ``rev`` already holds of later revisions: {revision: [(kind, name)]},
    kind "column" (of runs), "table" or "index"."""
    if conn.dialect.name != "sqlite" or not rev.isdigit():
        return {}
    kinds = dict(conn.execute(text("SELECT name, type FROM sqlite_master")).all())
    columns = {r[1] for r in conn.execute(text("PRAGMA table_info(runs)"))}
    found: dict[str, list[tuple[str, str]]] = {}
    for later, (cols, names) in _ADDS.items():
        if int(later) > int(rev):
            got = [("column", c) for c in cols if c in columns] + [(kinds[n], n) for n in names if n in kinds]
            if got:
                found[later] = got
    return found


def _half_upgraded(label: str) -> AttnresError:
    return AttnresError(f"database '{label}' was left half-upgraded by an interrupted upgrade: run "
                        "`attnres db upgrade` (it completes it, or says what to do)")


def _check_schema(engine: Engine, create: bool, url: str, label: str) -> None:
    with engine.connect() as conn:
        rev, unstamped = _read_revision(conn)
        later = _later_objects(conn, rev) if rev not in (None, HEAD) else {}
    if unstamped or later:
        raise _half_upgraded(label)
    if rev is None:
        if create:
            _create(url, engine)
            _wal(engine)
        return
    if rev == HEAD:
        _wal(engine)
        return
    _refuse_newer(rev)
    first = ("it keeps a copy of the file first" if engine.dialect.name == "sqlite"
             else "back the database up first")
    raise AttnresError(f"database schema is older (revision {rev}, this attnres uses {HEAD}); "
                       f"run `attnres db upgrade` ({first})")


def _refuse_newer(rev: str) -> None:
    if not (rev.isdigit() and int(rev) <= int(HEAD)):
        raise AttnresError(f"database schema revision {rev} is newer than this attnres ({HEAD}); upgrade attnres")


def _create(url: str, engine: Engine) -> None:
    """A new database's tables and stamp, in one transaction (a file killed while made is left empty)."""
    from alembic import command

    from attnres.tracking.schema import Base  # (the ORM: only for a new file's tables)

    memory = engine.dialect.name == "sqlite" and engine.url.database in (None, "", ":memory:")
    ddl = engine if memory else _ddl_engine(url, busy_timeout_s())  # (a second engine: another memory database)
    try:
        with ddl.begin() as conn:
            if _read_revision(conn)[0] is None:  # (another process may have made it meanwhile)
                Base.metadata.create_all(conn)
                command.stamp(_alembic(conn), HEAD)
    finally:
        if ddl is not engine:
            ddl.dispose()
