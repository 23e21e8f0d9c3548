"""What a store raises when its database cannot answer (away, locked past its wait, refused): SQLAlchemy's error.

Named here when asked for, not at import: a quick store's reads (``attnres status``) never import SQLAlchemy, and
its failures are raised as SQLAlchemy's (which imports it then).
"""

from __future__ import annotations

import sys


def __getattr__(name: str) -> type[Exception]:
    if name == "DatabaseError":
        from sqlalchemy.exc import SQLAlchemyError

        return SQLAlchemyError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``DatabaseError``, asked without importing SQLAlchemy: a process that never imported it
    has raised none."""
    loaded = sys.modules.get("sqlalchemy.exc")
    return loaded is not None and isinstance(exc, loaded.SQLAlchemyError)
