"""Launches: the stages of an experiment, and what ``attnres next`` pre-registered (see migration 0007).

Each ``attnres launch``, ``attnres next --launch`` and ``attnres import`` records one launch; the runs
it creates keep its id. ``attnres resume`` of a run that had ended, and a trainer started directly
(``python -m attnres.train`` without a run id), record one too. A report reads them back to know which
seeds arrived together (a stage, one look at the data when it completes) and which comparisons a
launch planned, with how many seeds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sqlalchemy import Engine, insert, select

from attnres.tracking.schema import Launch

if TYPE_CHECKING:
    import pandas as pd



def create(engine: Engine, origin: str, plan: Mapping[str, object] | None = None, study: int | None = None) -> int:
    """Record a launch (``origin``: launch, next or import; ``study``: the study it is a stage of) and return its
    id, which its runs keep."""
    from attnres.tracking.run_rows import now

    with engine.begin() as conn:
        return int(conn.execute(insert(Launch).values(
            created_at=now(), origin=origin, study_id=study,
            plan_json=json.dumps(plan, sort_keys=True) if plan else None)).inserted_primary_key[0])


def frame(engine: Engine) -> pd.DataFrame:
    """Every launch: id, created_at, origin, plan (the decoded pre-registration, or None)."""
    import pandas as pd

    with engine.connect() as conn:
        rows = conn.execute(select(Launch.id, Launch.created_at, Launch.origin, Launch.plan_json)
                            .order_by(Launch.id)).all()
    return pd.DataFrame([(i, at, o, json.loads(p) if p else None) for i, at, o, p in rows],
                        columns=["id", "created_at", "origin", "plan"])
