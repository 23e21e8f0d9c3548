"""Side-by-side comparison of variants: pure functions from DataFrames to tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from attnres.config import flatten
from reports import costs
from reports.stats import ReportError, finite, mean_ci, versus


def aligned_evals(runs: pd.DataFrame, evals: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Seed-mean eval loss per variant at the steps every compared variant reached, and Δ vs the first."""
    merged = finite(evals).merge(runs[["id", "variant"]], left_on="run_id", right_on="id")
    merged = merged[merged["variant"].isin(variants)]
    wide = merged.groupby(["step", "variant"])["value"].mean().unstack("variant")
    missing = [v for v in variants if v not in wide.columns]
    if missing:
        raise ReportError(f"no eval loss recorded for: {', '.join(missing)}")
    wide = wide[variants].dropna()
    if wide.empty:
        raise ReportError("the variants share no eval step")
    first = variants[0]
    for v in variants[1:]:
        wide[f"Δ {v}"] = wide[v] - wide[first]
    return wide.reset_index()


def seed_stats(runs: pd.DataFrame, evals: pd.DataFrame, variants: list[str], step: int) -> pd.DataFrame:
    """Per variant at ``step``: seeds, mean, std, 95% CI; against the first: Δ, Welch t/p with its
    Holm-adjusted p over the variants compared with the first (statsmodels), the paired test over shared
    seeds, and the seeds per arm an exact power calculation asks for, for the test they would face (paired
    when the arms hold the same seeds: :func:`reports.stats.seed_plan`), also at the spread's 80% upper bound."""
    at = finite(evals)[lambda e: e["step"] == step].merge(runs[["id", "variant", "seed"]], left_on="run_id",
                                                           right_on="id")
    by_seed = {v: dict(zip(g["seed"], g["value"], strict=True)) for v, g in at.groupby("variant")}
    ref = by_seed.get(variants[0], {})
    rows = []
    for v in variants:
        mine = by_seed.get(v, {})
        mean, std, lo, hi = mean_ci(np.array(list(mine.values())))
        ev = versus(mine, ref) if v != variants[0] else dict.fromkeys(
            ["t", "p", "paired_t", "paired_p", "seeds_needed", "seeds_upper"], math.nan) | {"pairs": 0, "design": ""}
        delta = mean - float(np.mean(list(ref.values()))) if ref and mine else math.nan
        rows.append({"variant": v, "seeds": len(mine), "mean": mean, "std": std, "ci_low": lo, "ci_high": hi,
                     "delta": delta, "welch_t": ev["t"], "welch_p": ev["p"], "paired_n": ev["pairs"],
                     "paired_t": ev["paired_t"], "paired_p": ev["paired_p"], "seeds_needed": ev["seeds_needed"],
                     "seeds_if_sd_80pct_high": ev["seeds_upper"], "seeds_for_test": ev["design"]})
    out = pd.DataFrame(rows)
    out.insert(out.columns.get_loc("welch_p") + 1, "holm_p", math.nan)
    tested = out.index[out["welch_p"].notna()]
    if len(tested):
        out.loc[tested, "holm_p"] = multipletests(out.loc[tested, "welch_p"].to_numpy(), method="holm")[1]
    return out


def config_diff(runs: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Config fields whose value differs between the variants (seed excluded), one column each."""
    per = {}
    for v in variants:
        row = runs[runs["variant"] == v].iloc[0]
        flat = flatten(json.loads(row["config_json"]))
        flat.pop("seed", None)
        per[v] = flat
    keys = sorted(set().union(*[set(f) for f in per.values()]))
    rows = [{"setting": k, **{v: per[v].get(k, "—") for v in variants}} for k in keys
            if len({json.dumps(per[v].get(k), sort_keys=True) for v in variants}) > 1]
    return pd.DataFrame(rows, columns=["setting", *variants])


def cost(runs: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Mean throughput and peak memory per variant, with change vs the first (%) where both were measured
    under the same conditions (:mod:`reports.costs`); otherwise the change is left out and ``measured``
    says what differs (`attnres report` then takes speed from a stored bench)."""
    mine = runs[runs["variant"].isin(variants)]
    g = mine.groupby("variant")[["tokens_per_s", "peak_memory_bytes"]].mean().reindex(variants)
    column = mine["conditions_json"] if "conditions_json" in mine else pd.Series(None, index=mine.index)
    sets = {v: [costs.condition_sets(c) for c in column[mine["variant"] == v]] for v in variants}
    first = variants[0]
    speed, memory = costs.fields_for([s for v in variants for s in sets[v]])
    speed_ok = [costs.alike(sets[v], sets[first], speed) for v in variants]
    memory_ok = [costs.alike(sets[v], sets[first], memory) for v in variants]
    g["tok/s vs first %"] = ((g["tokens_per_s"] / g["tokens_per_s"].iloc[0] - 1) * 100).where(speed_ok)
    g["memory vs first %"] = ((g["peak_memory_bytes"] / g["peak_memory_bytes"].iloc[0] - 1) * 100).where(memory_ok)

    def measured(v: str, ok: bool, fields: tuple[str, ...]) -> str:
        if not ok:
            return "not comparable: " + costs.differences(sets[v], sets[first], fields)
        return "conditions not recorded" if costs.unrecorded(sets[v] + sets[first]) else "alike"

    g["tok/s measured"] = [measured(v, ok, speed) for v, ok in zip(variants, speed_ok, strict=True)]
    g["memory measured"] = [measured(v, ok, memory) for v, ok in zip(variants, memory_ok, strict=True)]
    return g.reset_index()


def compare_markdown(aligned: pd.DataFrame, stats_: pd.DataFrame, diff: pd.DataFrame, costs: pd.DataFrame,
                     step: int, scope: object = None) -> str:
    """All comparison tables as one markdown document."""
    return "\n".join([
        f"# Comparison: {' vs '.join(stats_['variant'])}\n",
        *([f"Scope: {scope.label()}.\n"] if scope is not None else []),
        "## Eval loss at common steps (seed mean)\n", aligned.to_markdown(index=False, floatfmt=".4f"), "",
        f"## Statistics over seeds at step {step}\n", stats_.to_markdown(index=False, floatfmt=".4f"), "",
        "## Config differences\n", diff.to_markdown(index=False) if len(diff) else "_(none besides the variant)_", "",
        "## Throughput and memory\n", costs.to_markdown(index=False, floatfmt=".1f"), "",
    ])
