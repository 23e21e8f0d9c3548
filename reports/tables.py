"""The results document's tables, as DataFrames computed from a run table and an evals table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from attnres.tracking.states import EARLY
from reports.stats import ReportError, eval_at, mean_ci, seeds_to_resolve, stars, welch


def _fmt_seeds(seeds: list[int]) -> str:
    word = "seed" if len(seeds) == 1 else "seeds"
    return f"{len(seeds)} {word} ({', '.join(str(s) for s in seeds)})"


def per_variant(runs: pd.DataFrame, evals: pd.DataFrame, step: int) -> pd.DataFrame:
    """One row per variant at ``step``: mean eval, final train, seeds, throughput, memory, mark."""
    at = eval_at(runs, evals, step)
    if at.empty:
        raise ReportError(f"no run has an eval loss at step {step}")
    runs = runs.set_index("id")
    rows = []
    for variant, grp in at.groupby("variant", sort=False):
        ids = grp["run_id"].tolist()
        marks = sorted({m for m in grp["mark"] if m})
        rows.append({
            "variant": variant,
            "eval": grp["eval"].mean(),
            "train": runs.loc[ids, "final_train_loss"].mean(),
            "seeds": sorted(grp["seed"].astype(int).tolist()),
            "tokens_per_s": runs.loc[ids, "tokens_per_s"].mean(),
            "peak_memory_bytes": runs.loc[ids, "peak_memory_bytes"].mean(),
            "mark": "; ".join(marks),
        })
    return pd.DataFrame(rows)


def baseline_row(table: pd.DataFrame, baseline: str) -> pd.Series:
    hit = table[table["variant"] == baseline]
    if hit.empty:
        raise ReportError(f"no runs of the baseline '{baseline}' at this step; run it or pass --baseline")
    return hit.iloc[0]


def completed(table: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """The 'Completed experiments' table (markdown-ready strings), best first, marked rows last."""
    base = baseline_row(table, baseline)
    t = table.assign(delta=table["eval"] - base["eval"], marked=table["mark"] != "")
    t = t.sort_values(["marked", "eval"], kind="stable")
    star = {m: "*" * (i + 1) for i, m in enumerate(dict.fromkeys(m for m in t["mark"] if m))}
    out = pd.DataFrame({
        "Variant": t["variant"],
        "Eval Loss": [f"{e:.3f}{star.get(m, '')}" for e, m in zip(t["eval"], t["mark"], strict=True)],
        "Δ vs Baseline": ["—" if v == baseline else f"{d:+.3f}" for v, d in zip(t["variant"], t["delta"], strict=True)],
        "Train Loss (final)": [f"{x:.3f}{star.get(m, '')}" if not math.isnan(x) else "—"
                               for x, m in zip(t["train"], t["mark"], strict=True)],
        "Seeds": [_fmt_seeds(s) for s in t["seeds"]],
        "Throughput": [f"{x / 1000:.1f}k tok/s" if not math.isnan(x) else "—" for x in t["tokens_per_s"]],
    })
    out.attrs["footnotes"] = [f"{s}{m}." for m, s in star.items()]
    return out.reset_index(drop=True)


def multi_seed(runs: pd.DataFrame, evals: pd.DataFrame, step: int, baseline: str) -> dict[str, pd.DataFrame]:
    """For each variant with >= 2 seeds: per-seed rows, mean, std, 95% CI, Welch t vs baseline."""
    at = eval_at(runs, evals, step)
    at = at[at["mark"] == ""]
    train = runs.set_index("id")["final_train_loss"]
    base = at.loc[at["variant"] == baseline, "eval"].to_numpy()
    base_std = float(np.std(base, ddof=1)) if len(base) > 1 else float("nan")
    out: dict[str, pd.DataFrame] = {}
    for variant, grp in at.groupby("variant", sort=True):
        if grp["seed"].nunique() < 2:
            continue
        grp = grp.sort_values("seed")
        vals = grp["eval"].to_numpy()
        mean, std, lo, hi = mean_ci(vals)
        tstat, p = welch(vals, base) if variant != baseline else (float("nan"), float("nan"))
        delta = mean - float(np.mean(base)) if len(base) else float("nan")
        need = seeds_to_resolve(delta, std, base_std) if variant != baseline and len(base) else float("nan")
        rows = [{"Seed": str(int(s)), f"Eval Loss @ {step}": f"{e:.3f}", "Final Train Loss": f"{train[r]:.3f}"}
                for s, e, r in zip(grp["seed"], grp["eval"], grp["run_id"], strict=True)]
        rows.append({"Seed": "Mean", f"Eval Loss @ {step}": f"{mean:.3f}",
                     "Final Train Loss": f"{train[grp['run_id']].mean():.3f}"})
        rows.append({"Seed": "Std", f"Eval Loss @ {step}": f"{std:.4f}", "Final Train Loss": ""})
        rows.append({"Seed": "95% CI", f"Eval Loss @ {step}": f"[{lo:.3f}, {hi:.3f}]", "Final Train Loss": ""})
        table = pd.DataFrame(rows)
        table.attrs.update(mean=mean, std=std, ci=(lo, hi), t=tstat, p=p, delta=delta, seeds_needed=need,
                           n_baseline=len(base))
        out[variant] = table
    return out


def family_comparison(runs: pd.DataFrame, evals: pd.DataFrame, members: list[str], baseline: str,
                      label: str = "Shallow") -> tuple[pd.DataFrame, int, list[str]] | None:
    """Members vs the baseline at the largest step all their live runs reached.

    Returns (table, step, notes for members still too early) or None if nothing is comparable.
    """
    pool = runs[runs["variant"].isin([*members, baseline]) & ~runs["status"].isin(EARLY)]
    if pool.empty or baseline not in set(pool["variant"]):
        return None
    reached = {v: set.intersection(*[set(evals.loc[evals["run_id"] == rid, "step"]) for rid in g["id"]])
               for v, g in pool.groupby("variant")}
    base_steps = reached.pop(baseline)
    best: tuple[int, list[str]] | None = None
    for step in sorted(base_steps, reverse=True):
        ready = [v for v, s in reached.items() if step in s]
        if ready and (best is None or len(ready) > len(best[1])):
            best = (step, ready)
    if best is None or best[0] == 0:
        return None
    step, ready = best
    at = eval_at(pool, evals, step).groupby("variant")["eval"].mean()
    rows = [(v, at[v]) for v in [*ready, baseline]]
    rows.sort(key=lambda r: r[1])
    table = pd.DataFrame({
        "Model": [f"{label} {v}" if v == baseline else v for v, _ in rows],
        f"Eval @ {step}": [f"{e:.3f}" for _, e in rows],
        f"Δ vs {label} Baseline": ["—" if v == baseline else f"{e - at[baseline]:+.3f}" for v, e in rows],
    })
    notes = []
    for v in members:
        if v in reached and v not in ready:
            last = int(evals.loc[evals["run_id"].isin(pool.loc[pool["variant"] == v, "id"]), "step"].max())
            notes.append(f"{v} still too early to compare (step ~{last}).")
    return table, step, notes


def cost_benefit(table: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Quality Δ (stars), speed and memory cost vs baseline (%), and a verdict per variant.

    Verdict rule (stated in the document): Δ >= 0 is "Not worth it"; among improvements the
    largest is "Best quality", the largest improvement per unit of cost (speed cost % + memory
    cost %, at least 1) is "Best quality/cost ratio"; others are "Solid" with >= 2 stars,
    else "Modest". Early-ended variants are left out.
    """
    base = baseline_row(table, baseline)
    t = table[(table["variant"] != baseline) & (table["mark"] == "")].copy()
    if t.empty:
        return pd.DataFrame(columns=["Variant", "Quality (eval Δ)", "Speed Cost", "Memory Cost", "Verdict"])
    t["delta"] = t["eval"] - base["eval"]
    t["speed"] = (t["tokens_per_s"] / base["tokens_per_s"] - 1) * 100
    t["memory"] = (t["peak_memory_bytes"] / base["peak_memory_bytes"] - 1) * 100
    cost = (t["speed"].clip(upper=0).abs() + t["memory"].clip(lower=0)).clip(lower=1).fillna(1)
    t["ratio"] = -t["delta"] / cost
    better = t[t["delta"] < 0]
    best_q = better["delta"].idxmin() if len(better) else None
    best_r = better["ratio"].idxmax() if len(better) else None

    def verdict(i: int, row: pd.Series) -> str:
        if row["delta"] >= 0:
            return "Not worth it"
        if i == best_q:
            return "Best quality"
        if i == best_r:
            return "Best quality/cost ratio"
        return "Solid" if -row["delta"] >= 0.02 else "Modest"

    t = t.sort_values("delta")
    return pd.DataFrame({
        "Variant": t["variant"],
        "Quality (eval Δ)": [f"{stars(d)} ({d:+.3f})" for d in t["delta"]],
        "Speed Cost": [f"{s:+.0f}%" if not math.isnan(s) else "—" for s in t["speed"]],
        "Memory Cost": [f"{m:+.0f}%" if not math.isnan(m) else "—" for m in t["memory"]],
        "Verdict": [verdict(i, r) for i, r in t.iterrows()],
    }).reset_index(drop=True)
