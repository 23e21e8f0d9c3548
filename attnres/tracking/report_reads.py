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

from attnres.tracking import depth_rows, run_rows
from attnres.tracking.schema import Metric, MetricKey, MetricSummary
from attnres.tracking.states import EARLY
from attnres.variants.registry import superseded_runs

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


def _key_stats(engine: Engine, keys: list[str], run_ids: list[int]) -> dict[str, pd.DataFrame]:
    """Per key, per run (index): row count ``n``, ``mean``, max ``high`` and ``last_step`` of its values.

    Read from the runs' summaries (written when a run ends or is imported: a run that has them has
    one per key it logged); the runs without (still going, or ended before summaries existed) are
    aggregated here, those runs only.
    """
    cols = ["n", "mean", "high", "last_step"]
    if not run_ids:
        return {key: pd.DataFrame(columns=cols, dtype="float64") for key in keys}
    s, m = MetricSummary, Metric
    with engine.connect() as conn:
        done = set(conn.execute(select(s.run_id).where(s.run_id.in_(run_ids)).distinct()).scalars())
        missing = [r for r in run_ids if r not in done]
        out = {}
        for key in keys:
            key_id = select(MetricKey.id).where(MetricKey.name == key).scalar_subquery()
            kept = select(s.run_id, s.n, s.mean, s.high, s.last_step).where(s.key_id == key_id, s.run_id.in_(run_ids))
            rows = [tuple(r) for r in conn.execute(kept).all()]
            if missing:
                q = (select(m.run_id, func.count(), func.avg(m.value), func.max(m.value), func.max(m.step))
                     .where(m.key_id == key_id, m.run_id.in_(missing)).group_by(m.run_id))
                rows += [tuple(r) for r in conn.execute(q).all()]
            out[key] = pd.DataFrame(rows, columns=["run_id", *cols]).set_index("run_id").astype("float64")
    return out


def _evals(engine: Engine, where: object) -> pd.DataFrame:
    key = select(MetricKey.id).where(MetricKey.name == "eval_loss").scalar_subquery()
    q = select(Metric.run_id, Metric.step, Metric.value).where(Metric.key_id == key, where)
    with engine.connect() as conn:  # (plain tuples: pandas probes a Row's attributes, which costs more than the query)
        return pd.DataFrame([tuple(r) for r in conn.execute(q).all()], columns=["run_id", "step", "value"])


def _with_train(engine: Engine, evals: pd.DataFrame, ids: list[int]) -> pd.DataFrame:
    """``evals`` with a ``train`` column: each run's train loss at the same step (NaN where none was logged), so
    that a table compared at a step takes the train loss of that step too, not of whatever step a run reached."""
    steps = sorted(set(evals["step"].astype(int)))
    if not ids or not steps:
        return evals.assign(train=float("nan"))
    key = select(MetricKey.id).where(MetricKey.name == "train_loss").scalar_subquery()
    rows = []
    with engine.connect() as conn:
        for i in range(0, len(steps), 500):  # (bound parameters per statement stay well under SQLite's limit)
            q = select(Metric.run_id, Metric.step, Metric.value).where(
                Metric.key_id == key, Metric.run_id.in_(ids), Metric.step.in_(steps[i:i + 500]))
            rows += [tuple(r) for r in conn.execute(q).all()]
    train = pd.DataFrame(rows, columns=["run_id", "step", "train"])
    return evals.merge(train, on=["run_id", "step"], how="left")


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


@dataclass(frozen=True)
class Tables:
    """The small tables a report reads before it computes anything: the run rows (its scope is chosen from them),
    the stages with their pre-registered plans, the stored bench rows and the studies."""

    runs: pd.DataFrame
    launches: pd.DataFrame
    benchmarks: pd.DataFrame
    studies: pd.DataFrame


def tables(engine: Engine) -> Tables:
    """:class:`Tables`, read one after the other with nothing computed between (the metrics, read for the runs in
    scope, come after: :func:`load_results`)."""
    from attnres.tracking import launches, speed
    from attnres.tracking.studies import Studies

    return Tables(run_rows.runs_frame(engine), launches.frame(engine), speed.benchmarks(engine),
                  Studies(engine).frame())


def run_table(engine: Engine, experiment: str | None = None, preset: str | None = None) -> pd.DataFrame:
    """The run rows (of one experiment or preset, or all): what a report picks its scope from."""
    return run_rows.runs_frame(engine, experiment=experiment, preset=preset)


def load_results(engine: Engine, variants: list[str] | None = None, step: int | None = None,
                 runs: pd.DataFrame | None = None) -> Results:
    """What a report is computed from, for ``runs`` (default: all) of ``variants`` (default: all)."""
    runs = run_rows.runs_frame(engine) if runs is None else runs
    if variants is not None:
        runs = runs[runs["variant"].isin(variants)]
    old = superseded_runs(list(zip(runs["variant"], runs["config_json"], strict=True)))
    old_runs = runs.loc[old, ["id", "variant", "seed"]].reset_index(drop=True)
    runs = runs.loc[[not o for o in old]]
    ids = runs["id"].astype(int).tolist()
    stats = _key_stats(engine, ["eval_loss", "train_loss", "tokens_per_s", "peak_memory_bytes"], ids)
    last_step = stats["eval_loss"]["last_step"]
    n_rows = int(stats["eval_loss"]["n"].sum())
    common = _common_step(engine, runs, last_step) if ids else None
    if n_rows <= FULL_CURVES_UP_TO:
        evals = _evals(engine, Metric.run_id.in_(ids))
    else:
        stride = max(1, int(last_step.max()) // CURVE_POINTS)
        keep = set(range(0, int(last_step.max()) + 1, stride)) | ({step, common} - {None})
        evals = _evals(engine, Metric.run_id.in_(ids) & Metric.step.in_(sorted(keep)))  # primary-key lookups
        lasts = pd.DataFrame({"run_id": last_step.index.astype(int), "step": last_step.astype(int).values})
        missing = lasts.merge(evals, on=["run_id", "step"], how="left", indicator=True)
        missing = missing[missing["_merge"] == "left_only"]
        if len(missing):
            extra = _evals(engine, Metric.run_id.in_(missing["run_id"].tolist())
                           & Metric.step.in_(missing["step"].unique().tolist()))
            evals = pd.concat([evals, extra.merge(missing[["run_id", "step"]])], ignore_index=True)
    evals = _with_train(engine, evals, ids)
    train_step = stats["train_loss"]["last_step"]
    final_train = pd.Series(dtype="float64")
    if len(train_step):
        key = select(MetricKey.id).where(MetricKey.name == "train_loss").scalar_subquery()
        pairs = list(zip(train_step.index.astype(int), train_step.astype(int), strict=True))
        q = select(Metric.run_id, Metric.step, Metric.value).where(
            Metric.key_id == key, Metric.run_id.in_([p[0] for p in pairs]),
            Metric.step.in_(sorted({p[1] for p in pairs})))
        with engine.connect() as conn:
            rows = pd.DataFrame([tuple(r) for r in conn.execute(q).all()], columns=["run_id", "step", "value"])
        rows = rows.merge(pd.DataFrame(pairs, columns=["run_id", "step"]))
        final_train = rows.set_index("run_id")["value"]
    runs = runs.set_index("id", drop=False)
    runs["final_train_loss"] = final_train
    runs["tokens_per_s"] = stats["tokens_per_s"]["mean"]
    runs["peak_memory_bytes"] = stats["peak_memory_bytes"]["high"]
    return Results(runs.reset_index(drop=True), evals.sort_values(["run_id", "step"], ignore_index=True), common,
                   old_runs, depth_rows.maps(engine, ids))
