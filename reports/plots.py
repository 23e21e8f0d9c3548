"""Figures for the results document: DataFrames in, a matplotlib Figure out (saving is the caller's)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless: reports are written on servers and in CI
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure


def eval_curves(runs: pd.DataFrame, evals: pd.DataFrame, variants: list[str] | None = None) -> Figure:
    """Eval loss vs step per variant: the seed mean as a line, min-max over seeds as a band."""
    merged = evals.merge(runs[["id", "variant"]], left_on="run_id", right_on="id")
    if variants:
        merged = merged[merged["variant"].isin(variants)]
    fig, ax = plt.subplots(figsize=(8, 5))
    for variant, grp in sorted(merged.groupby("variant"), key=lambda kv: kv[0]):
        by_step = grp.groupby("step")["value"]
        mean, lo, hi = by_step.mean(), by_step.min(), by_step.max()
        ax.plot(mean.index, mean.values, label=f"{variant} ({grp['run_id'].nunique()} seed(s))")
        ax.fill_between(mean.index, lo.values, hi.values, alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("eval loss")
    ax.set_title("Held-out loss (mean over seeds, band = min-max)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def throughput_vs_delta(table: pd.DataFrame, baseline: str) -> Figure:
    """Scatter of tokens/s against eval-loss Δ vs the baseline, one labelled point per variant."""
    base = table[table["variant"] == baseline].iloc[0]
    fig, ax = plt.subplots(figsize=(7, 5))
    for row in table.itertuples():
        delta = row.eval - base["eval"]
        ax.scatter(row.tokens_per_s / 1000, delta, color="tab:red" if row.variant == baseline else "tab:blue")
        ax.annotate(row.variant, (row.tokens_per_s / 1000, delta), fontsize=8, xytext=(4, 2),
                    textcoords="offset points")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("throughput (k tok/s)")
    ax.set_ylabel(f"eval loss Δ vs {baseline} (lower is better)")
    ax.set_title("Cost vs benefit")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
