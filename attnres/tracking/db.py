"""Opening the tracking database: URL parsing, SQLite pragmas, schema creation and checks."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from attnres import paths
from attnres.errors import AttnresError

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig


def default_url() -> str:
    """``$ATTNRES_DB`` or ``./runs.db``."""
    return paths.default_db()


def normalize_url(db: str | None) -> str:
    """Accept a SQLAlchemy URL or a plain file path (taken as SQLite); reject what does not parse."""
    db = db or default_url()
    if "://" not in db:
        return f"sqlite:///{Path(db).expanduser().resolve()}"
    from sqlalchemy.engine import make_url

    try:
        url = make_url(db)
    except ArgumentError:
        raise AttnresError(f"--db '{db}' is not a database URL (e.g. sqlite:///runs.db, "
                           "postgresql+psycopg://user@host/db)") from None
    if url.drivername.startswith("sqlite") and url.database and url.database != ":memory:":
        url = url.set(database=str(Path(url.database).expanduser().resolve()))
    return url.render_as_string(hide_password=False)


def sqlite_path(db: str | None) -> Path | None:
    """The file of a SQLite database URL or path (None for other databases)."""
    url = normalize_url(db)
    return Path(url.split("///", 1)[1]) if url.startswith("sqlite") and "///" in url else None


def exists(db: str | None) -> bool:
    """Whether there is a database to read: a SQLite file must exist; a server database is assumed to."""
    path = sqlite_path(db)
    return path is None or path.exists()


def busy_timeout_s() -> float:
    """How long a SQLite writer waits for a lock before 'database is locked' ($ATTNRES_DB_BUSY_TIMEOUT)."""
    return float(os.environ.get("ATTNRES_DB_BUSY_TIMEOUT", "60"))


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
    return _engine(normalize_url(db), db, create, busy_timeout_s() if busy_s is None else busy_s)


def forget_engines() -> None:
    """Drop every engine made so far (after an upgrade changed the schema they checked)."""
    _engine.cache_clear()


@cache
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
        _check_schema(engine, create)
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


HEAD = "0009"  # the newest Alembic revision under migrations/versions


def _alembic(conn: Connection) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig  # (imported when a schema is made or migrated: not for status)

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.attributes["connection"] = conn
    return cfg


def _wal(engine: Engine) -> None:
    """WAL lets readers (status, reports) run beside writers; it is a property of the file."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            if conn.exec_driver_sql("PRAGMA journal_mode").scalar() != "wal":
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")


def revision(engine: Engine) -> str | None:
    """The database's schema revision: Alembic's, "0001" for a pre-Alembic attnres file, None if empty."""
    tables = set(inspect(engine).get_table_names())
    if "alembic_version" in tables:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return "0001" if "runs" in tables else None


def _check_schema(engine: Engine, create: bool) -> None:
    tables = set(inspect(engine).get_table_names())
    if tables and "runs" not in tables:
        raise AttnresError("database has tables but is not an attnres database; pass another --db")
    rev = revision(engine)
    if rev is None:
        if create:
            from alembic import command

            from attnres.tracking.schema import Base  # (the ORM: only for a new file's tables)

            Base.metadata.create_all(engine)
            with engine.begin() as conn:
                command.stamp(_alembic(conn), HEAD)
            _wal(engine)
        return
    if rev == HEAD:
        _wal(engine)
        return
    if rev.isdigit() and int(rev) < int(HEAD):
        raise AttnresError(f"database schema is older (revision {rev}, this attnres uses {HEAD}); "
                           "back it up, then run `attnres db upgrade`")
    raise AttnresError(f"database schema revision {rev} is newer than this attnres ({HEAD}); upgrade attnres")


def upgrade(db: str | None) -> tuple[str | None, str]:
    """Migrate a database to the newest schema in place, keeping its runs; returns (from, to)."""
    url = normalize_url(db)
    engine = create_engine(url)
    if url.startswith("sqlite"):
        event.listen(engine, "connect", _sqlite_pragmas(busy_timeout_s()))
    from alembic import command

    try:
        before = revision(engine)
        with engine.begin() as conn:
            cfg = _alembic(conn)
            if before == "0001" and "alembic_version" not in inspect(conn).get_table_names():
                command.stamp(cfg, "0001")
            command.upgrade(cfg, "head")
        _wal(engine)
    except RuntimeError as exc:  # a migration's own refusal (it says why)
        raise AttnresError(f"cannot upgrade database '{db or default_url()}': {exc}") from None
    except (DatabaseError, OperationalError) as exc:
        msg = str(exc.orig).splitlines()[0]
        raise AttnresError(f"cannot upgrade database '{db or default_url()}': {msg}") from None
    finally:
        engine.dispose()
    forget_engines()
    return before, HEAD
