"""What ``attnres status`` shows: a row per run, or a grid of variants x seeds, from the database."""

from __future__ import annotations

import pandas as pd
from sqlalchemy import Engine

from attnres.tracking import states, store
from attnres.variants import superseded


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None or x != x else format(x, spec)


def status_rows(engine: Engine, experiment: str | None = None, preset: str | None = None) -> list[dict[str, object]]:
    """One row per run (of one experiment or preset, or all) with its progress and latest metrics."""
    runs = store.runs_frame(engine, experiment=experiment, preset=preset)
    if runs.empty:
        return []
    last = store.latest_metrics(engine, ["train_loss", "eval_loss", "tokens_per_s", "peak_memory_bytes"],
                                runs["id"].tolist())
    rows = []
    for r in runs.itertuples():
        m: dict[str, float] = last.loc[r.id].to_dict() if r.id in last.index else {}
        status = r.status + (f" @{int(r.stop_step)}" if pd.notna(r.stop_step) else "")
        rows.append({
            "run": r.id, "experiment": r.experiment,
            "variant": r.variant + (" (old revision)" if superseded(r.variant, r.config_json) else ""),
            "status": status, "seed": r.seed,
            "step": f"{r.step}/{r.total_steps}",
            "train loss": _fmt(m.get("train_loss"), ".3f"), "eval loss": _fmt(m.get("eval_loss"), ".3f"),
            "tok/s": _fmt(m.get("tokens_per_s"), ",.0f"),
            "memory MiB": _fmt(m.get("peak_memory_bytes", float("nan")) / 2**20, ",.0f"),
        })
    return rows


def _cell(run: pd.Series) -> str:
    """One grid cell: state, progress and, while running, an ETA from the pace so far."""
    text = f"{run.status} {run.step}/{run.total_steps}"
    if run.status == states.RUNNING and run.step and pd.notna(run.started_at):
        elapsed = (store.now() - run.started_at).total_seconds()
        eta = elapsed / run.step * (run.total_steps - run.step)
        text += f" ETA {int(eta // 60)}:{int(eta % 60):02d}"
    if pd.notna(run.stop_step):
        text += f" @{int(run.stop_step)}"
    return text


def grid_rows(engine: Engine, experiment: str | None = None,
              preset: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Variant rows x seed columns (per experiment); each cell is the latest run of that pair."""
    runs = store.runs_frame(engine, experiment=experiment, preset=preset)
    if runs.empty:
        return ["variant"], [["no runs yet"]]
    seeds = sorted(runs["seed"].unique())
    latest = runs.sort_values("id").groupby(["experiment", "variant", "seed"]).tail(1)
    latest = latest.set_index(["experiment", "variant", "seed"])
    rows = []
    for exp, variant in dict.fromkeys(zip(runs["experiment"], runs["variant"], strict=True)):
        rows.append([exp, variant] + [_cell(latest.loc[(exp, variant, s)]) if (exp, variant, s) in latest.index
                                      else "—" for s in seeds])
    return ["experiment", "variant", *[f"seed {s}" for s in seeds]], rows
