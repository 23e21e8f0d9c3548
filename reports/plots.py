"""Figures for the results document: DataFrames in, a matplotlib Figure out (saving is the caller's).

A variant has one colour in every figure, the report's and compare's alike (:func:`color_of`, from
its place in the registry). Differences of 0.01-0.03 in eval loss are what matters, so curves are
drawn as Δ against the baseline, not as absolute loss.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # headless: reports are written on servers and in CI
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy import stats

from attnres.tracking.states import EARLY
from attnres.variants import VARIANTS
from reports.depthmaps import matrix, site_name
from reports.stats import finite, shown

# distinct colours, one per registered variant: tab10's, then the dark ones of tab20b
_PALETTE = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20b").colors)[0::4] + \
    list(plt.get_cmap("tab20b").colors)[2::4]


def color_of(variant: str) -> tuple[float, ...]:
    """The variant's fixed colour: by its place in the registry (unknown names after, by name)."""
    names = list(VARIANTS)
    i = names.index(variant) if variant in names else len(names) + sum(map(ord, variant))
    return tuple(_PALETTE[i % len(_PALETTE)])


def delta_series(runs: pd.DataFrame, evals: pd.DataFrame, variant: str, baseline: str) -> pd.DataFrame:
    """Per step: mean Δ over the variant's seeds against the baseline's seed mean, and its 95% t band."""
    ev = finite(evals).merge(runs[["id", "variant", "seed"]], left_on="run_id", right_on="id")
    base = ev[ev["variant"] == baseline].groupby("step")["value"].mean()
    mine = ev[ev["variant"] == variant]
    mine = mine[mine["step"].isin(base.index)]
    d = (mine["value"].to_numpy() - base.reindex(mine["step"]).to_numpy())
    by = pd.Series(d, index=mine["step"].to_numpy()).groupby(level=0)
    out = pd.DataFrame({"delta": by.mean(), "sd": by.std(ddof=1), "n": by.size()})
    t975 = {n: float(stats.t.ppf(0.975, n - 1)) for n in set(out["n"]) if n > 1}  # once per seed count
    half = [t975[n] * sd / math.sqrt(n) if n > 1 else math.nan for n, sd in zip(out["n"], out["sd"], strict=True)]
    rows = [(int(st), float(m), float(m - h), float(m + h), int(n))
            for st, m, h, n in zip(out.index, out["delta"], half, out["n"], strict=True)]
    return pd.DataFrame(rows, columns=["step", "delta", "lo", "hi", "n"])


def _near(series: dict[str, pd.DataFrame]) -> list[str]:
    """The variants whose last Δ is within 3x the median |Δ| of all: the close race worth a zoom."""
    last = {v: abs(float(s["delta"].iloc[-1])) for v, s in series.items()}
    scale = float(np.median(list(last.values()))) if last else 0.0
    return [v for v, d in last.items() if d <= 3 * scale] if scale > 0 else list(last)


def _draw(ax: plt.Axes, runs: pd.DataFrame, evals: pd.DataFrame, series: dict[str, pd.DataFrame], baseline: str,
          deep: set[str]) -> None:
    ax.axhline(0, color=color_of(baseline), lw=1.4, label=f"{baseline} (baseline)")
    ev = finite(evals)
    for v, s in series.items():
        n = int(s["n"].max())
        ax.plot(s["step"], s["delta"], color=color_of(v), lw=1.6, ls="--" if v in deep else "-",
                label=f"{v} ({n} seed{'s' * (n > 1)})")
        ax.fill_between(s["step"], s["lo"], s["hi"], color=color_of(v), alpha=0.15, lw=0)
        for run in runs[(runs["variant"] == v) & runs["status"].isin(EARLY)].itertuples():
            last = ev[ev["run_id"] == run.id].sort_values("step").tail(1)
            hit = s[s["step"].isin(last["step"])]
            if len(hit):
                ax.scatter(hit["step"], hit["delta"], marker="x", s=60, color=color_of(v), zorder=3)
                ax.annotate(run.status, (hit["step"].iloc[0], hit["delta"].iloc[0]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points", color=color_of(v))
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    means = [0.0] + [float(x) for sr in series.values() for x in sr["delta"]]
    lo, hi = min(means), max(means)
    pad = max(hi - lo, 1e-3) * 0.15  # the means decide the scale: a 2-seed band (t = 12.7) may run off it
    ax.set_ylim(lo - pad, hi + pad)


def delta_curves(runs: pd.DataFrame, evals: pd.DataFrame, baseline: str, variants: list[str] | None = None,
                 deep: set[str] | None = None) -> Figure:
    """Δ eval loss vs the baseline over steps: the seed mean as a line, its 95% interval as a band;
    runs that ended early marked ✕ at their last eval; ``deep`` variants dashed. When a few variants
    are far off, a second panel zooms on the close ones."""
    variants = [v for v in (variants or sorted(set(runs["variant"]))) if v != baseline]
    series = {v: s for v in variants if not (s := delta_series(runs, evals, v, baseline)).empty}
    near = _near(series)
    zoom = 0 < len(near) < len(series)
    fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(15 if zoom else 9, 5.2), squeeze=False)
    _draw(axes[0, 0], runs, evals, series, baseline, deep or set())
    axes[0, 0].set_ylabel(f"eval loss − {baseline}'s (lower is better)")
    axes[0, 0].set_title("all variants" if zoom else "Δ held-out loss vs the baseline", fontsize=10)
    if zoom:
        _draw(axes[0, 1], runs, evals, {v: series[v] for v in near}, baseline, deep or set())
        axes[0, 1].set_title(f"zoom: the {len(near)} variants closest to {baseline}", fontsize=10)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Δ eval loss vs the baseline: mean over seeds, band = 95% CI of the mean, ✕ = ended early",
                 fontsize=10)
    fig.tight_layout()
    return fig


def throughput_vs_delta(table: pd.DataFrame, baseline: str) -> Figure:
    """Tokens/s against eval-loss Δ vs the baseline: one point per variant, named in the legend (so no
    two labels can overprint), with the seeds' std as an error bar."""
    base = table[table["variant"] == baseline].iloc[0]
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for row in table.sort_values("eval").itertuples():
        x = row.tokens_per_s / 1000
        if not math.isfinite(x):
            continue
        delta = row.eval - base["eval"]
        err = row.std if isinstance(row.std, float) and math.isfinite(row.std) else None
        ax.errorbar(x, delta, yerr=err, fmt="s" if row.variant == baseline else "o", ms=8, capsize=3,
                    color=color_of(row.variant), label=f"{row.variant} ({shown(delta):+.3f})")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("throughput (k tok/s)")
    ax.set_ylabel(f"eval loss Δ vs {baseline} (lower is better)")
    ax.set_title("Cost vs benefit")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def depth_heatmaps(maps: dict[str, pd.DataFrame], title: str = "Depth attention") -> Figure:
    """One heatmap per variant: sites (rows) x sources (columns), mean softmax weight."""
    n = max(1, len(maps))
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.4 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (name, weights) in zip(axes.flat, maps.items(), strict=False):
        m = matrix(weights)
        im = ax.imshow(np.ma.masked_invalid(m.to_numpy(dtype=float)), vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(m.columns)), m.columns, rotation=60, ha="right", fontsize=7)
        ticks = list(range(len(m.index)))
        step = max(1, len(ticks) // 16)
        ax.set_yticks(ticks[::step], [site_name(int(s), len(m.index)) for s in m.index][::step], fontsize=7)
        ax.set_title(name, fontsize=9)
        if m.size <= 120:  # small maps carry their numbers
            for (i, j), w in np.ndenumerate(m.to_numpy(dtype=float)):
                if w == w:
                    ax.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if w < 0.6 else "black")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f"{title}: mean softmax weight per site (rows) on each source (columns)", fontsize=10)
    fig.tight_layout()
    return fig
