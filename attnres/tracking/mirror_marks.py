"""What the database knows about mirrors: its default mirrors, and how far each run reached each mirror.

A mark is, per (run, mirror, metric key), the last step the mirror was sent. Whoever sends a run to a
mirror (the trainer's background writer as the run goes, or ``attnres sync --mirror`` later) sends
only what is past the marks and moves them once the mirror took it: a point is sent once, and one a
mirror missed (it was down, its package missing) is what the next sender sends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sqlalchemy import Engine, delete, select

from attnres.errors import AttnresError
from attnres.tracking.schema import Meta, Metric, MetricKey, MirrorMark, Run

DEFAULT_KEY = "mirrors"  # the meta row that holds the database's default mirrors (a JSON list of specs)


def default_mirrors(engine: Engine) -> list[str] | None:
    """The database's default mirrors (``attnres mirror``), None when it has none."""
    with engine.connect() as conn:
        value = conn.execute(select(Meta.value).where(Meta.key == DEFAULT_KEY)).scalar()
    return json.loads(value) if value else None


def set_default_mirrors(engine: Engine, specs: Sequence[str] | None) -> None:
    """Make ``specs`` the mirrors of every run launched into this database without ``--mirror`` (None: clear)."""
    value = json.dumps(list(specs)) if specs else None
    if value is not None and len(value) > Meta.value.type.length:
        raise AttnresError(f"the mirror list is too long to keep in the database ({len(value)} characters; at most "
                           f"{Meta.value.type.length}): set ATTNRES_MIRROR instead")
    with engine.begin() as conn:
        conn.execute(delete(Meta).where(Meta.key == DEFAULT_KEY))
        if value is not None:
            conn.execute(Meta.__table__.insert().values(key=DEFAULT_KEY, value=value))


def marks(engine: Engine, run_id: int, target: str) -> dict[str, int]:
    """Per metric key, the last step of the run that ``target`` holds."""
    with engine.connect() as conn:
        rows = conn.execute(select(MirrorMark.key, MirrorMark.step)
                            .where(MirrorMark.run_id == run_id, MirrorMark.target == target)).all()
    return {key: int(step) for key, step in rows}


def save_marks(engine: Engine, run_id: int, target: str, reached: Mapping[str, int]) -> None:
    """Record how far ``target`` got (the whole mark of each key given, in one transaction)."""
    if not reached:
        return
    with engine.begin() as conn:
        conn.execute(delete(MirrorMark).where(MirrorMark.run_id == run_id, MirrorMark.target == target,
                                              MirrorMark.key.in_(list(reached))))
        conn.execute(MirrorMark.__table__.insert(), [{"run_id": run_id, "target": target, "key": k, "step": int(s)}
                                                     for k, s in reached.items()])


def unsent(engine: Engine, run_id: int, after: Mapping[str, int]) -> list[tuple[int, dict[str, float]]]:
    """The run's recorded values past the marks ``after``, as (step, {key: value}) in step order."""
    q = (select(Metric.step, MetricKey.name, Metric.value).join(MetricKey, MetricKey.id == Metric.key_id)
         .where(Metric.run_id == run_id).order_by(Metric.step, MetricKey.id))
    steps: dict[int, dict[str, float]] = {}
    with engine.connect() as conn:
        for step, key, value in conn.execute(q):
            if step > after.get(key, -1):
                steps.setdefault(int(step), {})[key] = float(value)
    return list(steps.items())


def mirrored_runs(engine: Engine, run_ids: Sequence[int] | None = None) -> list[Run]:
    """Run rows to send (``run_ids``, or every run), oldest first."""
    from sqlalchemy.orm import Session

    with Session(engine, expire_on_commit=False) as s:
        q = select(Run).order_by(Run.id)
        if run_ids is not None:
            q = q.where(Run.id.in_(list(run_ids)))
        runs = list(s.scalars(q))
        for run in runs:
            s.expunge(run)
    found = {r.id for r in runs}
    missing = [r for r in (run_ids or []) if r not in found]
    if missing:
        raise AttnresError(f"no run with id {missing[0]}")
    return runs
