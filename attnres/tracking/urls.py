"""Where the tracking database is: its URL, the SQLite file behind one, and the schema revision this attnres uses.

No SQLAlchemy here at import: ``attnres status`` and ``--help`` name the database before (or without) opening an
engine, and SQLAlchemy's import is ~0.3 s of a 2-core machine's command. A URL other than a plain SQLite file's
is parsed by SQLAlchemy (imported then).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from attnres import paths
from attnres.errors import AttnresError

HEAD = "0011"  # the newest Alembic revision under migrations/versions
# a file's path that SQLAlchemy renders as it is (it percent-encodes other characters, and decodes them when it
# parses): only such a path is taken without SQLAlchemy, so the URL is the same string either way
_PLAIN = re.compile(r"[A-Za-z0-9_./ +~-]+")


def default_url() -> str:
    """``$ATTNRES_DB`` or ``./runs.db``."""
    return paths.default_db()


def normalize_url(db: str | None) -> str:
    """Accept a SQLAlchemy URL or a plain file path (taken as SQLite); reject what does not parse. A SQLite file's
    URL comes back with its absolute path, as SQLAlchemy renders it."""
    db = db or default_url()
    if "://" not in db:
        return f"sqlite:///{Path(db).expanduser().resolve()}"
    plain = db.removeprefix("sqlite:///")
    if plain != db and _PLAIN.fullmatch(plain):
        path = str(Path(plain).expanduser().resolve())
        if _PLAIN.fullmatch(path):
            return f"sqlite:///{path}"  # (a file's path that needs no encoding)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(db)
    except ArgumentError:
        raise AttnresError(f"--db '{db}' is not a database URL (e.g. sqlite:///runs.db, "
                           "postgresql+psycopg://user@host/db)") from None
    if url.drivername.startswith("sqlite") and url.database and url.database != ":memory:":
        url = url.set(database=str(Path(url.database).expanduser().resolve()))
    return url.render_as_string(hide_password=False)


def public_url(url: str) -> str:
    """A database URL without user name or password (what shared documents may show)."""
    if url.startswith("sqlite:///") and _PLAIN.fullmatch(url.removeprefix("sqlite:///")):  # (a plain file's)
        return url
    from sqlalchemy.engine import URL, make_url

    u = make_url(url)
    return URL.create(u.drivername, host=u.host, port=u.port, database=u.database, query=u.query).render_as_string()


def sqlite_path(db: str | None) -> Path | None:
    """The file of a SQLite database URL or path (None for other databases)."""
    url = normalize_url(db)
    return Path(unquote(url.split("///", 1)[1])) if url.startswith("sqlite") and "///" in url else None


def sqlite_file(url: str) -> Path | None:
    """The file of a normalized URL when it names a plain SQLite file (no driver options, not in memory), decoded
    as the engine decodes it."""
    plain = url.removeprefix("sqlite:///")
    return Path(unquote(plain)) if plain != url and plain and "?" not in plain and plain != ":memory:" else None


def exists(db: str | None) -> bool:
    """Whether there is a database to read: a SQLite file must exist; a server database is assumed to."""
    path = sqlite_path(db)
    return path is None or path.exists()


def busy_timeout_s() -> float:
    """How long a SQLite writer waits for a lock before 'database is locked' ($ATTNRES_DB_BUSY_TIMEOUT)."""
    return float(os.environ.get("ATTNRES_DB_BUSY_TIMEOUT", "60"))
