"""Whether the database at the configured location really holds what was written (before a spool is emptied)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy import Engine

from attnres import depth_keys


def confirmed(engine: Engine, checks: Sequence[tuple[int, str | None, int | None]]) -> bool:
    """Whether the database *at the configured location* holds each run (and its (key, step) metric).

    Read through a new connection: for SQLite a read-only open of the file at the path now, so a
    pooled connection to a file deleted or replaced since cannot vouch for rows it wrote there.
    """
    if not checks:
        return True
    if engine.dialect.name == "sqlite":
        import sqlite3

        path = Path(engine.url.database or "")
        if not path.exists():
            return False
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        except sqlite3.Error:
            return False
        try:
            return all(_holds(conn.execute, "?", c) for c in checks)
        except sqlite3.Error:
            return False
        finally:
            conn.close()
    with engine.connect() as conn:
        return all(_holds(lambda sql, args: conn.exec_driver_sql(sql, tuple(args)), "%s", c) for c in checks)


def _holds(execute: Callable, mark: str, check: tuple[int, str | None, int | None]) -> bool:
    run_id, key, step = check
    if execute(f"SELECT 1 FROM runs WHERE id = {mark}", [run_id]).fetchone() is None:  # noqa: S608 - placeholders
        return False
    if key is None:
        return True
    if key.startswith(depth_keys.PREFIX):
        site, _, source = key[len(depth_keys.PREFIX):].partition(":")
        row = execute(f"SELECT 1 FROM depth_weights WHERE run_id = {mark} AND step = {mark} "  # noqa: S608
                      f"AND site = {mark} AND source = {mark}", [run_id, step, int(site), source]).fetchone()
        return row is not None
    row = execute(f"SELECT 1 FROM metrics m JOIN metric_keys k ON k.id = m.key_id "  # noqa: S608 - placeholders
                  f"WHERE m.run_id = {mark} AND k.name = {mark} AND m.step = {mark}", [run_id, key, step]).fetchone()
    return row is not None
