"""Run and metric tracking over SQLAlchemy 2 (SQLite with WAL by default, any URL otherwise).

The package's public face, and all that code outside it may import (``tests/test_architecture.py`` checks it):
the store (:class:`RunStore`, in :mod:`~attnres.tracking.run_store`), its values (:mod:`~attnres.tracking.records`)
and the run states (:mod:`~attnres.tracking.states`), plus the names below, each imported from here and loaded
when first used (``attnres status`` pays for none it does not use). The engine, the ORM rows, the SQL and the
spool's format stay inside.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnres.tracking.bench_anchor import check_server, raw_sqlite_insert_s, scratch_database
    from attnres.tracking.failures import DatabaseError, is_database_error
    from attnres.tracking.records import RunRecord, StudyRecord
    from attnres.tracking.report_reads import Results
    from attnres.tracking.run_store import RunStore
    from attnres.tracking.spool import held
    from attnres.tracking.transfer import imported_text, read_import
    from attnres.tracking.upgrade import upgrade as upgrade_database
    from attnres.tracking.urls import normalize_url
    from attnres.tracking.writer import MetricWriter

#: name -> (module, attribute): the face's names beside its three modules
FACE: dict[str, tuple[str, str]] = {
    "RunStore": ("run_store", "RunStore"),  # the one door to the database
    "DatabaseError": ("failures", "DatabaseError"),
    "is_database_error": ("failures", "is_database_error"),  # the same, asked without importing SQLAlchemy
    "RunRecord": ("records", "RunRecord"),
    "StudyRecord": ("records", "StudyRecord"),
    "Results": ("report_reads", "Results"),  # what a report reads, in one go
    "MetricWriter": ("writer", "MetricWriter"),  # a trainer's writer (a store hands it out)
    "normalize_url": ("urls", "normalize_url"),  # `--db` as the URL a run records
    "upgrade_database": ("upgrade", "upgrade"),  # `attnres db upgrade` (not `upgrade`: the module's name)
    "read_import": ("transfer", "read_import"),  # an import file, checked before the database is opened
    "imported_text": ("transfer", "imported_text"),
    "held": ("spool", "held"),  # a run's spool lock (one sender of a run at a time)
    "raw_sqlite_insert_s": ("bench_anchor", "raw_sqlite_insert_s"),  # `attnres bench tracker`'s anchors
    "check_server": ("bench_anchor", "check_server"),
    "scratch_database": ("bench_anchor", "scratch_database"),
}
__all__ = [  # (the modules, and FACE's names)
    "DatabaseError", "MetricWriter", "Results", "RunRecord", "RunStore", "StudyRecord", "check_server", "held",
    "imported_text", "is_database_error", "normalize_url", "raw_sqlite_insert_s", "read_import", "records", "run_store",
    "scratch_database", "states", "upgrade_database",
]


def __getattr__(name: str) -> Any:
    if name not in FACE:
        raise AttributeError(f"module 'attnres.tracking' has no attribute {name!r}")
    module, attribute = FACE[name]
    value = getattr(importlib.import_module(f"attnres.tracking.{module}"), attribute)
    globals()[name] = value
    return value
