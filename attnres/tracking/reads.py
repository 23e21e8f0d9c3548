"""What reports read from the database, as DataFrames (the only database reads of reporting).

A report reads only what it shows: the run rows; eval loss at the compared step, each run's
last eval, and the eval curves (thinned to about ``CURVE_POINTS`` per run when there are very
many); the last train loss; throughput and peak memory aggregated in SQL. So a report over
millions of metric rows stays well under a second or two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from sqlalchemy import Engine, func, select

from attnres.tracking import depth_maps, store
from attnres.tracking.schema import Metric, MetricKey
from attnres.tracking.states import EARLY
from attnres.variants import superseded

CURVE_POINTS = 200
FULL_CURVES_UP_TO = 200_000  # eval rows; above this, curves are thinned


@dataclass
class Results:
    """Everything a report is computed from.

    runs:  one row per run (id, variant, seed, status, step, total_steps, stop_step, ...) plus
           final_train_loss, tokens_per_s (mean over logged intervals), peak_memory_bytes (max).
    evals: long table (run_id, step, value) of eval loss: every point, or a thinned curve that
           always keeps ``step`` and each run's last eval.
    step:  the largest eval step every live run reached (None if there is none).
    superseded: runs left out because an earlier revision of their variant trained them (id,
           variant, seed): they are not comparable with runs of the current revision.
    """

    runs: pd.DataFrame
    evals: pd.DataFrame
    step: int | None
    superseded: pd.DataFrame = field(default_factory=pd.DataFrame)
    maps: pd.DataFrame = field(default_factory=pd.DataFrame)  # depth maps: each run's last one


def _per_run(engine: Engine, key: str, agg: object, run_ids: list[int], column: object = None) -> pd.Series:
    column = Metric.value if column is None else column
    q = (select(Metric.run_id, agg(column))  # type: ignore[operator]
         .where(Metric.key_id == select(MetricKey.id).where(MetricKey.name == key).scalar_subquery(),
                Metric.run_id.in_(run_ids)).group_by(Metric.run_id))
    with engine.connect() as conn:
        return pd.Series(dict(conn.execute(q).all()), dtype="float64")


def _evals(engine: Engine, where: object) -> pd.DataFrame:
    key = select(MetricKey.id).where(MetricKey.name == "eval_loss").scalar_subquery()
    q = select(Metric.run_id, Metric.step, Metric.value).where(Metric.key_id == key, where)
    with engine.connect() as conn:
        return pd.DataFrame(conn.execute(q).all(), columns=["run_id", "step", "value"])


def _common_step(engine: Engine, runs: pd.DataFrame, last_step: pd.Series) -> int | None:
    """Largest eval step all live runs share: the smallest last step, if all have it."""
    live = runs.loc[~runs["status"].isin(EARLY), "id"].tolist()
    if not live or any(r not in last_step.index for r in live):
        return None
    candidate = int(last_step[live].min())
    have = _evals(engine, Metric.run_id.in_(live) & (Metric.step == candidate))
    if len(have) == len(live):
        return candidate
    full = _evals(engine, Metric.run_id.in_(live))  # irregular eval grids: the exact, slower way
    shared = set.intersection(*[set(g["step"]) for _, g in full.groupby("run_id")]) if len(full) else set()
    return max(shared) if shared else None


def run_table(engine: Engine, experiment: str | None = None, preset: str | None = None) -> pd.DataFrame:
    """The run rows (of one experiment or preset, or all): what a report picks its scope from."""
    return store.runs_frame(engine, experiment=experiment, preset=preset)


def load_results(engine: Engine, variants: list[str] | None = None, step: int | None = None,
                 runs: pd.DataFrame | None = None) -> Results:
    """What a report is computed from, for ``runs`` (default: all) of ``variants`` (default: all)."""
    runs = store.runs_frame(engine) if runs is None else runs
    if variants is not None:
        runs = runs[runs["variant"].isin(variants)]
    old = [superseded(v, c) for v, c in zip(runs["variant"], runs["config_json"], strict=True)]
    old_runs = runs.loc[old, ["id", "variant", "seed"]].reset_index(drop=True)
    runs = runs.loc[[not o for o in old]]
    ids = runs["id"].astype(int).tolist()
    last_step = _per_run(engine, "eval_loss", func.max, ids, Metric.step) if ids else pd.Series(dtype=float)
    n_rows = int(_per_run(engine, "eval_loss", func.count, ids).sum()) if ids else 0
    common = _common_step(engine, runs, last_step) if ids else None
    if n_rows <= FULL_CURVES_UP_TO:
        evals = _evals(engine, Metric.run_id.in_(ids))
    else:
        stride = max(1, int(last_step.max()) // CURVE_POINTS)
        keep = Metric.step % stride == 0
        for s in {step, common} - {None}:
            keep = keep | (Metric.step == s)
        evals = _evals(engine, Metric.run_id.in_(ids) & keep)
        lasts = pd.DataFrame({"run_id": last_step.index.astype(int), "step": last_step.astype(int).values})
        missing = lasts.merge(evals, on=["run_id", "step"], how="left", indicator=True)
        missing = missing[missing["_merge"] == "left_only"]
        if len(missing):
            extra = _evals(engine, Metric.run_id.in_(missing["run_id"].tolist())
                           & Metric.step.in_(missing["step"].unique().tolist()))
            evals = pd.concat([evals, extra.merge(missing[["run_id", "step"]])], ignore_index=True)
    train_step = _per_run(engine, "train_loss", func.max, ids, Metric.step) if ids else pd.Series(dtype=float)
    final_train = pd.Series(dtype="float64")
    if len(train_step):
        key = select(MetricKey.id).where(MetricKey.name == "train_loss").scalar_subquery()
        pairs = list(zip(train_step.index.astype(int), train_step.astype(int), strict=True))
        q = select(Metric.run_id, Metric.step, Metric.value).where(
            Metric.key_id == key, Metric.run_id.in_([p[0] for p in pairs]),
            Metric.step.in_(sorted({p[1] for p in pairs})))
        with engine.connect() as conn:
            rows = pd.DataFrame(conn.execute(q).all(), columns=["run_id", "step", "value"])
        rows = rows.merge(pd.DataFrame(pairs, columns=["run_id", "step"]))
        final_train = rows.set_index("run_id")["value"]
    runs = runs.set_index("id", drop=False)
    runs["final_train_loss"] = final_train
    runs["tokens_per_s"] = _per_run(engine, "tokens_per_s", func.avg, ids) if ids else float("nan")
    runs["peak_memory_bytes"] = _per_run(engine, "peak_memory_bytes", func.max, ids) if ids else float("nan")
    return Results(runs.reset_index(drop=True), evals.sort_values(["run_id", "step"], ignore_index=True), common,
                   old_runs, depth_maps.maps(engine, ids))
