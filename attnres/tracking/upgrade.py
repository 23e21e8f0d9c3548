"""``attnres db upgrade``: all or nothing. Every migration runs in one SQLite transaction (``BEGIN IMMEDIATE``;
pysqlite would otherwise commit DDL before the first DML), after a copy of the file is made beside it; an
interrupted upgrade is found by its marker and finished, and files an older attnres left half-upgraded are
repaired or refused with the one thing to do."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError

from attnres.errors import AttnresError
from attnres.tracking.db import (
    HEAD,
    _alembic,
    _ddl_engine,
    _later_objects,
    _read_revision,
    _refuse_newer,
    _wal,
    busy_timeout_s,
    default_url,
    forget_engines,
    normalize_url,
    sqlite_path,
)


def _migrate(conn: Connection, before: str | None, say: Callable[[str], None]) -> None:
    """Every migration from ``before`` to HEAD on ``conn``, inside its transaction."""
    from alembic import command

    cfg = _alembic(conn)
    if conn.dialect.name == "sqlite" and before is not None:
        _drop_leftovers(conn, _leftovers(conn, before), say)
    if before == "0001":
        if "alembic_version" not in inspect(conn).get_table_names():
            command.stamp(cfg, "0001")  # a pre-Alembic file
        elif conn.execute(text("SELECT 1 FROM alembic_version")).first() is None:
            say("its alembic_version table was empty (an interrupted upgrade had lost its stamp): "
                "taken as revision 0001")
            command.stamp(cfg, "0001")
    command.upgrade(cfg, "head")


def _leftovers(conn: Connection, rev: str) -> list[tuple[str, str]]:
    """What an interrupted upgrade by an older attnres left committed in a SQLite file stamped ``rev``, to
    drop before that migration runs again from its start: Alembic's batch copies, and the next revision's
    new columns, (empty) tables and indexes. Anything more is a file this cannot repair: refused."""
    names = conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'table' "
                              "AND name LIKE '\\_alembic\\_tmp\\_%' ESCAPE '\\'")).scalars().all()
    later = _later_objects(conn, rev)
    nxt = f"{int(rev) + 1:04d}"
    nonempty = [n for kind, n in later.get(nxt, []) if kind == "table"
                and conn.exec_driver_sql(f'SELECT 1 FROM "{n}" LIMIT 1').first()]  # noqa: S608 - _ADDS's names
    if set(later) - {nxt} or nonempty:
        what = ", ".join(f"{_named(k, n)} ({r})" for r, objs in sorted(later.items()) for k, n in objs)
        raise AttnresError(f"it is stamped revision {rev} but already holds {what}: an interrupted upgrade "
                           "left it half done; put back the copy of it made before that upgrade, then run "
                           "`attnres db upgrade` again")
    order = ("index", "table", "column")  # (indexes first: an indexed column cannot be dropped)
    return [("table", n) for n in names] + sorted(later.get(nxt, []), key=lambda o: order.index(o[0]))


def _named(kind: str, name: str) -> str:
    return f"runs.{name}" if kind == "column" else name


def _drop_leftovers(conn: Connection, objs: list[tuple[str, str]], say: Callable[[str], None]) -> None:
    for kind, name in objs:
        conn.exec_driver_sql(f'ALTER TABLE runs DROP COLUMN "{name}"' if kind == "column"
                             else f'DROP {kind.upper()} "{name}"')
    if objs:
        say("an interrupted upgrade had left " + ", ".join(_named(k, n) for k, n in objs)
            + ": dropped, to be made again")


# -- db upgrade: one transaction, and for SQLite a copy of the file first -----------------------------
def _marker(path: Path) -> Path:
    """While an upgrade runs, ``<file>.upgrading`` names its copy of the file (JSON): a rerun after a kill
    finds the copy there, and says so, instead of making another."""
    return path.with_name(path.name + ".upgrading")


def _read_marker(path: Path) -> dict | None:

    try:
        got = json.loads(_marker(path).read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) and isinstance(got.get("backup"), str) else None


def _write_marker(path: Path, backup: Path, rev: str) -> None:

    tmp = _marker(path).with_name(_marker(path).name + ".tmp")
    tmp.write_text(json.dumps({"backup": str(backup), "from": rev}) + "\n")
    os.replace(tmp, _marker(path))


def _backup_path(path: Path, rev: str) -> Path:

    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup, n = path.with_name(f"{path.name}.before-upgrade-{rev}-{stamp}"), 1
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}.before-upgrade-{rev}-{stamp}-{n}")
    return backup


def _copy_aside(path: Path, backup: Path, busy_s: float) -> None:
    """A consistent copy of the SQLite file (the backup API: WAL content included), made under a
    temporary name and renamed when complete, so a copy killed half way never passes for one."""
    import glob

    for stale in path.parent.glob(glob.escape(path.name) + ".before-upgrade-*.partial*"):
        stale.unlink(missing_ok=True)  # (a copy killed half way, and its journal)
    partial = backup.with_name(backup.name + ".partial")
    try:
        _sqlite_copy(str(path), partial, busy_s)
        os.replace(partial, backup)
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        raise AttnresError(f"cannot copy the database aside before upgrading it ({backup}): {exc}; nothing "
                           "was changed") from None


def _sqlite_copy(source: str, target: Path, busy_s: float) -> None:
    """SQLite's backup API from ``source`` (a path or a ``file:`` URI) into ``target``, page by page under the
    files' locks: the one way this module copies a database, aside and back."""
    with closing(sqlite3.connect(source, timeout=busy_s, uri=source.startswith("file:"))) as src, \
            closing(sqlite3.connect(target, timeout=busy_s)) as dst:
        src.backup(dst)


def _restore(backup: Path, path: Path) -> None:
    """Put the copy back over the file (the backup API: under the file's lock, its journal kept right)."""
    try:
        _sqlite_copy(f"file:{backup}?mode=ro", path, busy_timeout_s())
    except sqlite3.Error as exc:
        raise AttnresError(f"cannot put the copy {backup} back over the file: {exc}; with no attnres command "
                           f"running, copy it over by hand (cp '{backup}' '{path}')") from None


def _state(engine: Engine) -> tuple[str | None, bool]:
    """(revision, half): ``half`` when an interrupted upgrade left the file between two revisions."""
    with engine.connect() as conn:
        rev, unstamped = _read_revision(conn)
        return rev, unstamped or bool(rev not in (None, HEAD) and _later_objects(conn, rev))


def upgrade(db: str | None, say: Callable[[str], None] = lambda _line: None) -> tuple[str | None, str]:
    """Migrate a database to the newest schema in place, keeping its runs; returns (from, to).

    All or nothing: every migration runs in one transaction, so a failure or a kill leaves the database
    as it was. A SQLite file is first copied beside it (``<file>.before-upgrade-<rev>-<time>``, kept);
    a file that an interrupted upgrade left half done is completed, or put back from that copy.
    ``say`` gets the lines to show as it goes (where the copy is, what was repaired).
    """
    url = normalize_url(db)
    label = db or default_url()
    try:
        engine = _ddl_engine(url, busy_timeout_s())
    except (ArgumentError, ImportError) as exc:
        raise AttnresError(f"cannot use database '{label}': {exc}") from None
    made: list[Path] = []  # the copy made before the upgrade, for a failure's message
    try:
        before = _upgrade(engine, sqlite_path(url), say, made)
        _wal(engine)
    except RuntimeError as exc:  # a migration's own refusal (it says why)
        raise AttnresError(f"cannot upgrade database '{label}': {exc}{_unchanged(made)}") from None
    except (DatabaseError, OperationalError) as exc:
        msg = str(exc.orig).splitlines()[0] if exc.orig else str(exc)
        raise AttnresError(f"cannot upgrade database '{label}': {msg}{_unchanged(made)}") from None
    except AttnresError as exc:
        raise AttnresError(f"cannot upgrade database '{label}': {exc}{_unchanged(made)}") from None
    finally:
        engine.dispose()
    forget_engines()
    return before, HEAD


def _unchanged(made: list[Path]) -> str:
    return (f"; the upgrade was rolled back and the database is as it was (the copy made before it, kept: "
            f"{made[0]})") if made else ""


def _upgrade(engine: Engine, path: Path | None, say: Callable[[str], None], made: list[Path]) -> str | None:
    """The revision before; ``made`` gets the copy of a SQLite file as soon as it is complete."""
    if path is None or not path.exists():  # a server (DDL in the transaction) or a new file: nothing to copy
        with engine.begin() as conn:
            before = _read_revision(conn)[0]
            _refuse_newer(before or HEAD)
            if before != HEAD:
                _migrate(conn, before, say)
        return before
    earlier = _read_marker(path)
    copy = Path(earlier["backup"]) if earlier and Path(earlier["backup"]).is_file() else None
    start = _state(engine)
    restored = False
    if start[1] and copy:
        engine.dispose()  # (no connection of ours on the file while it is put back)
        _restore(copy, path)
        restored = True
        say(f"an earlier upgrade of this file was interrupted half way: put back the copy made before it, {copy}")
        start = _state(engine)
    with engine.connect() as conn:
        trans = conn.begin()  # BEGIN IMMEDIATE: no other writer from here to the commit
        try:
            before = _read_revision(conn)[0]
            _refuse_newer(before or HEAD)
            if before is None or before == HEAD:  # nothing to keep, or nothing to do
                if before is None:
                    _migrate(conn, None, say)
                trans.commit()
                if earlier and before == HEAD and copy:
                    say(f"an earlier upgrade of this file had finished; the copy made before it is kept: {copy}")
                _marker(path).unlink(missing_ok=True)
                return before
            if conn.dialect.name == "sqlite":
                _leftovers(conn, before)  # (a file this cannot repair is refused before any copy)
            if copy and earlier.get("from") == before:  # the file is as that copy (the upgrade was rolled back)
                if not restored:
                    say("an earlier upgrade of this file was interrupted; the file is as it was before it "
                        "(an upgrade is one transaction)")
                backup = copy
            else:
                if earlier and not restored:
                    say("an earlier upgrade of this file was interrupted before it changed anything")
                backup = _backup_path(path, before)
                _write_marker(path, backup, before)
                _copy_aside(path, backup, busy_timeout_s())
            made.append(backup)
            say(f"backup of the database before the upgrade: {backup} (kept: delete it when no longer needed)")
            _migrate(conn, before, say)
            trans.commit()
        except Exception:
            if trans.is_active:
                trans.rollback()
            conn.close()
            if made:
                _settle(engine, path, start, made[0], say)
            _marker(path).unlink(missing_ok=True)  # (this attempt is over: a rerun makes a new copy)
            raise
    _marker(path).unlink(missing_ok=True)
    return before


def _settle(engine: Engine, path: Path, start: tuple[str | None, bool], backup: Path,
            say: Callable[[str], None]) -> None:
    """After a failed upgrade: the rollback left the file as it was; should anything have escaped it,
    the copy is put back."""
    try:
        clean = _state(engine) == start
    except (AttnresError, DatabaseError, OperationalError):
        clean = False
    if not clean:
        engine.dispose()
        _restore(backup, path)
        say(f"the upgrade failed half way: put back the copy made before it, {backup}")
