"""Studies (``attnres study``, migration 0011): a study's row, the process driving it, and its stages' runs.

A study is recorded before it launches anything and names the process that drives it; its stages are the
launches that name it (``launches.study_id``, written with the launch). So a study stopped anywhere (Ctrl-C,
SIGTERM, a lost machine) is found again with every stage it launched, and a second process cannot drive it
while the first one lives (:meth:`Studies.claim` is a compare-and-set). What a study is for, and when it ends, is
:mod:`attnres.runs.study`'s; this module only records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.orm import Session

from attnres.errors import AttnresError
from attnres.tracking.records import ENDED, GOING, RunRecord, StudyRecord
from attnres.tracking.schema import Launch, Run, Study
from attnres.tracking.states import now

if TYPE_CHECKING:
    import pandas as pd



def _record(row: Study, stages: list[int]) -> StudyRecord:
    return StudyRecord(row.id, row.created_at, row.command_key, json.loads(row.scope_json), row.label,
                       json.loads(row.limits_json), row.state, row.end_reason, row.message, row.ended_at,
                       row.runs_spent, row.hours_spent, row.hours_carried, row.driver_host, row.driver_pid,
                       row.driver_since, tuple(stages))


class Studies:
    """The studies of one database (``RunStore.studies``): the only code that reads or writes their rows."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def create(self, command_key: str, scope: Mapping[str, object], label: str, limits: Mapping[str, object]) -> int:
        """Record a new study (going, nothing spent, no driver yet) and return its id."""
        with self._engine.begin() as conn:
            return int(conn.execute(insert(Study).values(
                created_at=now(), command_key=command_key, scope_json=json.dumps(scope, sort_keys=True),
                label=label, limits_json=json.dumps(limits, sort_keys=True), state=GOING, runs_spent=0,
                hours_spent=0.0, hours_carried=0.0)).inserted_primary_key[0])

    def get(self, study_id: int) -> StudyRecord:
        """The study as recorded now (AttnresError, one line: no such study)."""
        with Session(self._engine) as s:
            row = s.get(Study, study_id)
            if row is None:
                raise AttnresError(f"no study {study_id} in this database")
            stages = list(s.scalars(select(Launch.id).where(Launch.study_id == study_id).order_by(Launch.id)))
            return _record(row, stages)

    def unfinished(self, command_key: str) -> StudyRecord | None:
        """The newest study started by the same command that has not ended (None: none)."""
        with self._engine.connect() as conn:
            found = conn.execute(select(Study.id).where(Study.command_key == command_key, Study.state != ENDED)
                                 .order_by(Study.id.desc()).limit(1)).scalar()
        return None if found is None else self.get(int(found))

    def claim(self, study_id: int, host: str, pid: int, since: datetime, seen: int | None) -> bool:
        """Make this process (``host``, ``pid``, started ``since``) the study's driver, only if its driver is still
        ``seen`` (None: none): two processes never both drive one study. The study is going again."""
        match = Study.driver_pid.is_(None) if seen is None else Study.driver_pid == seen
        with self._engine.begin() as conn:
            done = conn.execute(update(Study).where(Study.id == study_id, match).values(
                driver_host=host, driver_pid=pid, driver_since=since, state=GOING, end_reason=None, message=None,
                ended_at=None))
        return done.rowcount == 1

    def update(self, study_id: int, *, driver: int | None = None, **columns: object) -> None:
        """Change a study's columns (``limits`` as a dict); with ``driver``, only while that process still drives
        it (a study another process took over is left to it)."""
        if "limits" in columns:
            columns["limits_json"] = json.dumps(columns.pop("limits"), sort_keys=True)
        match = [Study.driver_pid == driver] if driver is not None else []
        with self._engine.begin() as conn:
            conn.execute(update(Study).where(Study.id == study_id, *match).values(**columns))

    def runs(self, study_id: int) -> list[RunRecord]:
        """The runs of the study's stages, oldest first."""
        stages = select(Launch.id).where(Launch.study_id == study_id)
        with Session(self._engine) as s:
            return [RunRecord.of(r) for r in s.scalars(select(Run).where(Run.launch_id.in_(stages)).order_by(Run.id))]

    def frame(self) -> pd.DataFrame:
        """Every study, oldest first: id, created_at, scope and limits (dicts), label, state, end_reason, message,
        ended_at, runs_spent, hours_spent and stages (how many it launched). What a report reads."""
        import pandas as pd

        with self._engine.connect() as conn:
            rows = conn.execute(select(Study.__table__).order_by(Study.id)).mappings().all()
            stages = dict(conn.execute(select(Launch.study_id, func.count()).where(Launch.study_id.is_not(None))
                                       .group_by(Launch.study_id)).all())
        columns = ["id", "created_at", "scope", "label", "limits", "state", "end_reason", "message", "ended_at",
                   "runs_spent", "hours_spent", "stages"]
        return pd.DataFrame([{**r, "scope": json.loads(r["scope_json"]), "limits": json.loads(r["limits_json"]),
                              "stages": int(stages.get(r["id"], 0))} for r in rows], columns=columns)
