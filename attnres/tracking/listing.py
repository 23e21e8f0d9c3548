"""What ``attnres status`` reads, in SQLAlchemy Core alone: the runs it lists and their latest values.

The command should answer in well under a second over thousands of runs. Importing the ORM and
building the mapped classes of :mod:`attnres.tracking.schema` costs about 0.3 s of a 2-core
machine's second (pandas and torch more), so these reads name the few columns they use with
``sqlalchemy.table``/``column`` (no metadata, no mapper). The tables are defined once, in the
schema module; ``tests/test_tracker.py`` checks every column named here exists there.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, Select, bindparam, column, func, select, table

from attnres.tracking.states import ACTIVE

STATUS_COLUMNS = ["id", "experiment", "preset", "variant", "seed", "status", "step", "total_steps", "stop_step",
                  "config_json", "heartbeat_at"]
RUNS = table("runs", *(column(c) for c in STATUS_COLUMNS))
MESSAGES = table("runs", column("id"), column("message"))
METRICS = table("metrics", column("run_id"), column("key_id"), column("step"), column("value"))
METRIC_KEYS = table("metric_keys", column("id"), column("name"))


def any_active(engine: Engine) -> bool:
    """Whether some run is queued or running (only then can a dead process need reconciling)."""
    with engine.connect() as conn:
        return conn.execute(select(RUNS.c.id).where(RUNS.c.status.in_(ACTIVE)).limit(1)).first() is not None


def status_runs(engine: Engine, experiment: str | None = None, preset: str | None = None,
                recent: int | None = None) -> tuple[list[dict[str, object]], int]:
    """What ``attnres status`` lists: every active run and the ``recent`` newest others (None: all),
    oldest first, as plain dicts; and how many runs match the filter in all."""
    r = RUNS.c
    where = []
    if experiment is not None:
        where.append(r.experiment == experiment)
    if preset is not None:
        where.append(r.preset == preset)
    q = select(*(r[c] for c in STATUS_COLUMNS)).where(*where)
    if recent is not None:
        newest = select(r.id).where(*where).order_by(r.id.desc()).limit(recent)
        q = q.where(r.status.in_(ACTIVE) | r.id.in_(newest))
    with engine.connect() as conn:
        rows = [dict(zip(STATUS_COLUMNS, row, strict=True)) for row in conn.execute(q.order_by(r.id)).all()]
        total = conn.execute(select(func.count()).select_from(RUNS).where(*where)).scalar() or 0
    return rows, int(total)


def latest_values(engine: Engine, run_ids: Sequence[int], keys: Sequence[str]) -> dict[int, dict[str, float]]:
    """Each run's newest value of each key: one primary-key lookup per (run, key), never a scan of the
    run's steps (a thousand runs of long curves answer in milliseconds)."""
    m = METRICS.c
    last = (select(m.value).where(m.run_id == bindparam("run"), m.key_id == bindparam("key"))
            .order_by(m.step.desc()).limit(1))
    return _each(engine, run_ids, keys, last)


def mean_values(engine: Engine, run_ids: Sequence[int], keys: Sequence[str]) -> dict[int, dict[str, float]]:
    """Each run's mean of each key over its logged values (a primary-key range per (run, key)): for
    ``tokens_per_s`` the mean over the run's timed logged intervals, the figure a report gives a run."""
    m = METRICS.c
    return _each(engine, run_ids, keys, select(func.avg(m.value)).where(m.run_id == bindparam("run"),
                                                                         m.key_id == bindparam("key")))


def _each(engine: Engine, run_ids: Sequence[int], keys: Sequence[str], query: Select) -> dict[int, dict[str, float]]:
    """``query`` (one value, bound to ``run`` and ``key``) for each run and key: {run: {key: value}}."""
    out: dict[int, dict[str, float]] = {r: {} for r in run_ids}
    with engine.connect() as conn:
        k = METRIC_KEYS.c
        ids = dict(conn.execute(select(k.name, k.id).where(k.name.in_(list(keys)))).all())
        for run_id in run_ids:
            for name, key_id in ids.items():
                value = conn.execute(query, {"run": run_id, "key": key_id}).scalar()
                if value is not None:
                    out[run_id][name] = float(value)
    return out


def messages(engine: Engine, run_ids: Sequence[int]) -> dict[int, str]:
    """Why each of these runs is where it is (its recorded message), for the runs that have one."""
    if not run_ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(select(MESSAGES.c.id, MESSAGES.c.message).where(MESSAGES.c.id.in_(list(run_ids)))).all()
    return {int(i): str(m) for i, m in rows if m}
