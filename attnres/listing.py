"""Rows for the CLI's listings (variants, status): plain dicts, rendered by the CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from sqlalchemy import Engine

from attnres.tracking import store
from attnres.variants import ALIASES, VARIANTS, resolve_run

if TYPE_CHECKING:
    from attnres.model import GPT


def depth_sources(model: GPT) -> list[int]:
    """Sources each site attends to, found by running the real forward on the meta device."""
    import torch

    residual = model.residual
    if not hasattr(residual, "record"):
        return []
    residual.record = True
    idx = torch.zeros(1, 1, dtype=torch.long, device="meta")
    with torch.no_grad():
        model(idx)
    residual.record = False
    return [len(r.kinds) for r in residual.records]


PARAM_COLUMNS = ["step queries", "readout query", "key gains", "other"]
PARAMS_NOTE = ("Depth-attention parameters. step queries: those of the layers' (or sublayers') sites, "
               "low-rank query factors included; readout query: the mix before the final norm has a query "
               "of its own (block_mqa_depth shares its one query with it); key gains: the key norm's gains; "
               "other: ALiBi slopes, the value projection; depth: their sum; total: the whole model. "
               "sources: how many tensors a site attends over (fewest-most).")


def variant_rows(preset: str | None) -> list[dict[str, object]]:
    """Name, description, revision, depth sources (min-max over sites) and, at a preset, parameters."""
    import torch

    from attnres.model import GPT

    aliases = {v: [a for a, t in ALIASES.items() if t == v] for v in VARIANTS}
    rows = []
    for name, v in VARIANTS.items():
        cfg = resolve_run(name, preset or "tiny", 0).model
        with torch.device("meta"):
            model = GPT(cfg)
        counts = depth_sources(model)
        params = model.num_params()
        sources = f"{min(counts)}-{max(counts)}" if counts else "all"
        if preset:  # a parameter table: the descriptions and aliases are in the plain listing
            split = model.residual.param_counts() if hasattr(model.residual, "param_counts") else {}
            row: dict[str, object] = {"variant": name, "shape": f"{cfg.n_layer}L d{cfg.d_model}", "sources": sources}
            for key in PARAM_COLUMNS:
                row[key] = f"{split[key]:,}" if split else "—"
            row["depth"] = f"{params['residual_extra']:,}"
            row["total"] = f"{params['total'] / 1e6:,.1f}M"
        else:
            row = {"variant": name + (f" ({', '.join(aliases[name])})" if aliases[name] else ""),
                   "rev": v.revision, "description": v.description, "depth sources": sources,
                   "extra params": f"{params['residual_extra']:,}"}
        rows.append(row)
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None or x != x else format(x, spec)


def status_rows(engine: Engine) -> list[dict[str, object]]:
    """One row per run with its progress and latest metrics."""
    runs = store.runs_frame(engine)
    if runs.empty:
        return []
    last = store.latest_metrics(engine, ["train_loss", "eval_loss", "tokens_per_s", "peak_memory_bytes"],
                                runs["id"].tolist())
    rows = []
    for r in runs.itertuples():
        m: dict[str, float] = last.loc[r.id].to_dict() if r.id in last.index else {}
        status = r.status + (f" @{int(r.stop_step)}" if pd.notna(r.stop_step) else "")
        rows.append({
            "run": r.id, "variant": r.variant, "status": status, "seed": r.seed,
            "step": f"{r.step}/{r.total_steps}",
            "train loss": _fmt(m.get("train_loss"), ".3f"), "eval loss": _fmt(m.get("eval_loss"), ".3f"),
            "tok/s": _fmt(m.get("tokens_per_s"), ",.0f"),
            "memory MiB": _fmt(m.get("peak_memory_bytes", float("nan")) / 2**20, ",.0f"),
        })
    return rows


def _cell(run: pd.Series) -> str:
    """One grid cell: state, progress and, while running, an ETA from the pace so far."""
    text = f"{run.status} {run.step}/{run.total_steps}"
    if run.status == "running" and run.step and pd.notna(run.started_at):
        elapsed = (store.now() - run.started_at).total_seconds()
        eta = elapsed / run.step * (run.total_steps - run.step)
        text += f" ETA {int(eta // 60)}:{int(eta % 60):02d}"
    if pd.notna(run.stop_step):
        text += f" @{int(run.stop_step)}"
    return text


def grid_rows(engine: Engine) -> tuple[list[str], list[list[str]]]:
    """Variant rows x seed columns; each cell is the latest run of that pair."""
    runs = store.runs_frame(engine)
    if runs.empty:
        return ["variant"], [["no runs yet"]]
    seeds = sorted(runs["seed"].unique())
    latest = runs.sort_values("id").groupby(["variant", "seed"]).tail(1).set_index(["variant", "seed"])
    rows = []
    for variant in dict.fromkeys(runs["variant"]):
        rows.append([variant] + [_cell(latest.loc[(variant, s)]) if (variant, s) in latest.index else "—"
                                 for s in seeds])
    return ["variant", *[f"seed {s}" for s in seeds]], rows
