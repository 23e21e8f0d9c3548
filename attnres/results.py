"""Gather what reports need from the database, as DataFrames (the only I/O of reporting).

Reads only what a report shows: run rows, the eval-loss curve (a few points per run), the
last train loss, and per-run throughput and peak memory aggregated in SQL, so a report over
millions of metric rows stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from sqlalchemy import Engine, func, select

from attnres.tracking import store
from attnres.tracking.schema import Metric, MetricKey


@dataclass
class Results:
    """Everything a report is computed from.

    runs:  one row per run (id, variant, seed, status, step, total_steps, stop_step, ...) plus
           final_train_loss, tokens_per_s (mean over logged intervals), peak_memory_bytes (max).
    evals: long table (run_id, step, value) of eval loss.
    train: long table (run_id, step, value) of train loss, only when asked for (curves).
    """

    runs: pd.DataFrame
    evals: pd.DataFrame
    train: pd.DataFrame | None = None


def _aggregate(engine: Engine, key: str, agg: object, run_ids: list[int]) -> pd.Series:
    q = (select(Metric.run_id, agg(Metric.value))  # type: ignore[operator]
         .join(MetricKey, MetricKey.id == Metric.key_id)
         .where(MetricKey.name == key, Metric.run_id.in_(run_ids)).group_by(Metric.run_id))
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    return pd.Series({r: v for r, v in rows}, dtype="float64")


def load_results(engine: Engine, variants: list[str] | None = None, with_train_curves: bool = False) -> Results:
    runs = store.runs_frame(engine)
    if variants is not None:
        runs = runs[runs["variant"].isin(variants)]
    ids = runs["id"].astype(int).tolist()
    evals = store.metrics_frame(engine, ["eval_loss"], ids)[["run_id", "step", "value"]]
    last = store.latest_metrics(engine, ["train_loss"], ids) if ids else pd.DataFrame()
    runs = runs.set_index("id", drop=False)
    runs["final_train_loss"] = last["train_loss"] if "train_loss" in last else float("nan")
    runs["tokens_per_s"] = _aggregate(engine, "tokens_per_s", func.avg, ids) if ids else float("nan")
    runs["peak_memory_bytes"] = _aggregate(engine, "peak_memory_bytes", func.max, ids) if ids else float("nan")
    train = None
    if with_train_curves:
        train = store.metrics_frame(engine, ["train_loss"], ids)[["run_id", "step", "value"]]
    return Results(runs.reset_index(drop=True), evals, train)
