"""Figures for the results document: DataFrames in, a matplotlib Figure out (saving is the caller's).

A variant has one colour in every figure, the report's and compare's alike (:func:`color_of`, from
its place in the registry). Differences of 0.01-0.03 in eval loss are what matters, so curves are
drawn as Δ against the baseline, not as absolute loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import matplotlib

matplotlib.use("Agg")  # headless: reports are written on servers and in CI
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from attnres.reports.depth_maps import matrix, site_name
from attnres.reports.numbers import throughput_unit
from attnres.reports.stats import design, finite, intervals, level_text, shown
from attnres.tracking.states import EARLY
from attnres.variants.registry import VARIANTS

# distinct colours, one per registered variant: tab10's, then the dark ones of tab20b
_PALETTE = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20b").colors)[0::4] + \
    list(plt.get_cmap("tab20b").colors)[2::4]


def color_of(variant: str) -> tuple[float, ...]:
    """The variant's fixed colour: by its place in the registry (unknown names after, by name)."""
    names = list(VARIANTS)
    i = names.index(variant) if variant in names else len(names) + sum(map(ord, variant))
    return tuple(_PALETTE[i % len(_PALETTE)])


def colors(names: Iterable[str]) -> dict[str, tuple[float, ...]]:
    """Colours for one figure: a variant its fixed one (:func:`color_of`); a cell of one (``control_block@lr=1e-3``)
    the next colour no other name of the figure has, so two settings of one variant are told apart."""
    names = list(names)
    out = {n: color_of(n) for n in names if "@" not in n}
    free = [c for c in _PALETTE if tuple(c) not in set(out.values())]
    for i, n in enumerate(n for n in names if "@" in n):
        out[n] = tuple(free[i % len(free)])
    return out


def delta_series(runs: pd.DataFrame, evals: pd.DataFrame, variant: str, baseline: str,
                 confidence: float = 0.95, run_ids: Iterable[int] | None = None) -> pd.DataFrame:
    """Per step: Δ of the seed means (variant - baseline) and the interval of that difference, for the test
    the tables make of it (:func:`reports.stats.interval`: paired over the same seeds, else Welch) at
    ``confidence``, over the seeds each arm has at the step (``run_ids``: only these runs, as a table tested).

    A band of the variant's seeds alone would leave the baseline's spread out and claim what the test
    rejects; this one is the table's interval at the table's step. Steps are taken together where the arms
    hold the same seeds (every step but those past a run that ended early): one matrix of values per such group
    (:func:`reports.stats.intervals`), not one test per step.
    """
    keep = runs if run_ids is None else runs[runs["id"].isin(list(run_ids))]
    keep = keep[keep["variant"].isin([variant, baseline])].sort_values("id")
    keep = keep.drop_duplicates(["variant", "seed"], keep="last")  # a rerun replaces its seed
    ev = finite(evals).merge(keep[["id", "variant", "seed"]], left_on="run_id", right_on="id")
    ev = ev.drop_duplicates(["variant", "seed", "step"], keep="last")
    columns = ["step", "delta", "lo", "hi", "n", "test"]
    if ev.empty or not {variant, baseline} <= set(ev["variant"]):
        return pd.DataFrame([], columns=columns)
    wide = ev.assign(seed=ev["seed"].astype(int)).pivot(index="step", columns=["variant", "seed"], values="value")
    arm_a, arm_b = wide[variant].astype(float), wide[baseline].astype(float)
    held = pd.concat([arm_a.notna(), arm_b.notna()], axis=1, keys=["a", "b"])
    pattern = pd.Series([r.tobytes() for r in held.to_numpy()], index=held.index)
    parts = []
    for _, steps in pattern.groupby(pattern, sort=False).groups.items():
        a = arm_a.loc[steps].dropna(axis=1, how="all")
        b = arm_b.loc[steps].dropna(axis=1, how="all")
        if a.shape[1] == 0 or b.shape[1] == 0:
            continue
        seeds_a, seeds_b = set(a.columns), set(b.columns)
        test = design(dict.fromkeys(seeds_a), dict.fromkeys(seeds_b)) if len(seeds_a) >= 2 and len(seeds_b) >= 2 \
            else ""
        paired = len(seeds_a) >= 2 and seeds_a == seeds_b
        if paired:
            b = b[list(a.columns)]
        lo, hi = intervals(a.to_numpy(), b.to_numpy(), paired, confidence)
        parts.append(pd.DataFrame({"step": np.asarray(steps, dtype=int),
                                   "delta": a.to_numpy().mean(axis=1) - b.to_numpy().mean(axis=1),
                                   "lo": lo, "hi": hi, "n": a.shape[1], "test": test}))
    if not parts:
        return pd.DataFrame([], columns=columns)
    return pd.concat(parts, ignore_index=True).sort_values("step", ignore_index=True)[columns]


def _near(series: dict[str, pd.DataFrame]) -> list[str]:
    """The variants whose last Δ is within 3x the median |Δ| of all: the close race worth a zoom."""
    last = {v: abs(float(s["delta"].iloc[-1])) for v, s in series.items()}
    scale = float(np.median(list(last.values()))) if last else 0.0
    return [v for v, d in last.items() if d <= 3 * scale] if scale > 0 else list(last)


def _draw(ax: plt.Axes, runs: pd.DataFrame, evals: pd.DataFrame, series: dict[str, pd.DataFrame], baseline: str,
          deep: set[str], levels: Mapping[str, float]) -> None:
    color = colors([baseline, *series])
    ax.axhline(0, color=color[baseline], lw=1.4, label=f"{baseline} (baseline)")
    ev = finite(evals)
    for v, s in series.items():
        n = int(s["n"].max())
        ax.plot(s["step"], s["delta"], color=color[v], lw=1.6, ls="--" if v in deep else "-",
                marker="o" if len(s) == 1 else None,  # one step only: a point, which a line alone would not show
                label=f"{v} ({n} seed{'s' * (n > 1)}; band {level_text(levels.get(v, 0.95))})")
        ax.fill_between(s["step"], s["lo"], s["hi"], color=color[v], alpha=0.15, lw=0)
        for run in runs[(runs["variant"] == v) & runs["status"].isin(EARLY)].itertuples():
            last = ev[ev["run_id"] == run.id].sort_values("step").tail(1)
            hit = s[s["step"].isin(last["step"])]
            if len(hit):
                ax.scatter(hit["step"], hit["delta"], marker="x", s=60, color=color[v], zorder=3)
                ax.annotate(run.status, (hit["step"].iloc[0], hit["delta"].iloc[0]), fontsize=7,
                            xytext=(4, 4), textcoords="offset points", color=color[v])
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    means = [0.0] + [float(x) for sr in series.values() for x in sr["delta"]]
    lo, hi = min(means), max(means)
    pad = max(hi - lo, 1e-3) * 0.15  # the means decide the scale: a 2-seed band (t = 12.7) may run off it
    ax.set_ylim(lo - pad, hi + pad)


def delta_curves(runs: pd.DataFrame, evals: pd.DataFrame, baseline: str, variants: list[str] | None = None,
                 deep: set[str] | None = None, bands: Mapping[str, tuple[Iterable[int] | None, float]] | None = None
                 ) -> Figure | None:
    """Δ eval loss vs the baseline over steps: the difference of seed means as a line, its interval as a band;
    runs that ended early marked ✕ at their last eval; ``deep`` variants dashed. When a few variants are far
    off, a second panel zooms on the close ones. None when no variant has a Δ at any step (nothing to draw but
    the baseline's line: :func:`no_delta` says why).

    ``bands`` gives, per variant, the runs its table tested (None: all) and the confidence its decision uses,
    so that at the table's step the band is the table's interval (95% for a variant not given).
    """
    variants = [v for v in (variants or sorted(set(runs["variant"]))) if v != baseline]
    bands = bands or {}
    levels = {v: bands[v][1] if v in bands else 0.95 for v in variants}
    series = {v: s for v in variants
              if not (s := delta_series(runs, evals, v, baseline, levels[v], bands.get(v, (None, 0))[0])).empty}
    if not series:
        return None
    near = _near(series)
    zoom = 0 < len(near) < len(series)
    fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(15 if zoom else 9, 5.2), squeeze=False)
    _draw(axes[0, 0], runs, evals, series, baseline, deep or set(), levels)
    axes[0, 0].set_ylabel(f"eval loss − {baseline}'s (lower is better)")
    axes[0, 0].set_title("all variants" if zoom else "Δ held-out loss vs the baseline", fontsize=10)
    if zoom:
        _draw(axes[0, 1], runs, evals, {v: series[v] for v in near}, baseline, deep or set(), levels)
        axes[0, 1].set_title(f"zoom: the {len(near)} variants closest to {baseline}", fontsize=10)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Δ eval loss vs the baseline (difference of seed means). Band: the interval of the difference for "
                 "the table's test (paired over the same seeds, else Welch)\nat the level of its decision; it "
                 "holds 0 where the table finds no difference. ✕ = ended early", fontsize=9)
    fig.tight_layout()
    return fig


def no_delta(runs: pd.DataFrame, baseline: str) -> str:
    """Why the Δ figure is left out (:func:`delta_curves` gave None), as the document's sentence."""
    if set(runs["variant"]) <= {baseline}:
        return f"No Δ figure: only the baseline, {baseline}, has runs here; it has nothing to be compared with."
    return (f"No Δ figure: no variant has an eval loss yet at a step where {baseline} has one (their runs are "
            "queued or behind); it is drawn once one has.")


def no_throughput(baseline: str, step: int) -> str:
    """Why the throughput figure is left out (:func:`throughput_vs_delta` gave None), as the document's sentence."""
    return f"No throughput figure: no variant compared with {baseline} at step {step:,} has a throughput recorded."


def throughput_vs_delta(table: pd.DataFrame, baseline: str,
                        intervals: Mapping[str, tuple[float, float]] | None = None) -> Figure | None:
    """Tokens/s against eval-loss Δ vs the baseline: one point per variant, named in the legend (so no two
    labels can overprint), with the Δ interval of its test (``intervals``: the Evidence table's) as its bar;
    a variant without one has no bar (one arm's spread is not the uncertainty of a difference). The axis is in
    tok/s or k tok/s as the values' size asks (:func:`reports.numbers.throughput_unit`); None when no variant but
    the baseline has a throughput recorded (nothing to set against it: :func:`no_throughput` says so)."""
    base = table[table["variant"] == baseline].iloc[0]
    scale, unit = throughput_unit(table["tokens_per_s"])
    if not math.isfinite(throughput_unit(table.loc[table["variant"] != baseline, "tokens_per_s"])[0]):
        return None
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for row in table.sort_values("eval").itertuples():
        x = row.tokens_per_s / scale
        if not math.isfinite(x):
            continue
        delta = row.eval - base["eval"]
        lo, hi = (intervals or {}).get(row.variant, (math.nan, math.nan))
        ax.plot(x, delta, "s" if row.variant == baseline else "o", ms=8, color=color_of(row.variant),
                label=f"{row.variant} ({shown(delta):+.3f})")
        if math.isfinite(lo) and math.isfinite(hi):
            ax.vlines(x, lo, hi, color=color_of(row.variant), lw=1.5)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel(f"throughput ({unit})")
    ax.set_ylabel(f"eval loss Δ vs {baseline} (lower is better)")
    ax.set_title("Cost vs benefit (bar: the Δ interval of the Statistical Evidence table)", fontsize=10)
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
        columns = list(range(len(m.columns)))
        every = max(1, len(columns) // 24)  # a wide map (full AttnRes: ~50 sources) names every k-th source
        ax.set_xticks(columns[::every], list(m.columns)[::every], rotation=60, ha="right", fontsize=7)
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
