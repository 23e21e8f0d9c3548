"""Depth-attention maps in the database: each site's mean weight on each source, per eval.

The trainer hands them over as metric values with keys ``depth:SITE:SOURCE`` (see :func:`key`), so
they travel the metric path unchanged: spool first, batched insert-or-ignore, retried, dropped
past a resume point. :func:`split` routes them to their own table at the last moment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Engine, delete, func, select

from attnres.depth_keys import PREFIX
from attnres.tracking.schema import DepthWeight

if TYPE_CHECKING:
    import pandas as pd  # imported where a frame is made: `attnres status` does without it




def split(rows: Sequence[tuple[int, str, float]]) -> tuple[list[tuple[int, str, float]], list[dict[str, object]]]:
    """(metric rows, depth-weight rows without run_id) of a batch of (step, key, value) rows."""
    metrics, weights = [], []
    for step, k, value in rows:
        if k.startswith(PREFIX):
            site, _, source = k[len(PREFIX):].partition(":")
            if not math.isfinite(value):  # (SQLite cannot hold NaN; a weight that is not a number says nothing)
                continue
            weights.append({"step": int(step), "site": int(site), "source": source, "weight": float(value)})
        else:
            metrics.append((step, k, value))
    return metrics, weights


def drop_after(conn: object, run_id: int, step: int) -> None:
    """Delete a run's maps past ``step`` (inside the caller's transaction)."""
    conn.execute(delete(DepthWeight).where(DepthWeight.run_id == run_id, DepthWeight.step > step))  # type: ignore[attr-defined]


def maps(engine: Engine, run_ids: Sequence[int], step: int | None = None) -> pd.DataFrame:
    """Long table (run_id, step, site, source, weight); ``step`` None: each run's last recorded map."""
    import pandas as pd

    cols = ["run_id", "step", "site", "source", "weight"]
    if not run_ids:
        return pd.DataFrame(columns=cols)
    q = select(DepthWeight.run_id, DepthWeight.step, DepthWeight.site, DepthWeight.source, DepthWeight.weight)
    q = q.where(DepthWeight.run_id.in_(list(run_ids)))
    if step is not None:
        q = q.where(DepthWeight.step == step)
    else:
        last = (select(DepthWeight.run_id, func.max(DepthWeight.step).label("step"))
                .where(DepthWeight.run_id.in_(list(run_ids))).group_by(DepthWeight.run_id).subquery())
        q = q.join(last, (DepthWeight.run_id == last.c.run_id) & (DepthWeight.step == last.c.step))
    with engine.connect() as conn:
        return pd.DataFrame(conn.execute(q).all(), columns=cols)


def steps(engine: Engine, run_id: int) -> list[int]:
    """The eval steps at which a run has a map."""
    with engine.connect() as conn:
        return list(conn.execute(select(DepthWeight.step).where(DepthWeight.run_id == run_id).distinct()
                                 .order_by(DepthWeight.step)).scalars())
