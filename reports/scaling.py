"""Scaling laws over a compute ladder: ``L(C) = E + A · C^(−α)`` per variant, and what it buys against the baseline.

Pure functions: a DataFrame of runs in (one row per finished run: variant, seed, size, compute in FLOPs and the
eval loss it reached), fits, tables and a figure out. The fit is scipy's ``curve_fit`` over every run of a
variant (compute scaled to the ladder's smallest, so the three parameters are of one order); its intervals are
a bootstrap over seeds: each replicate draws, at every size, as many runs as that size has, with replacement,
and is fitted again. The compute-equivalent multiplier of a variant at compute ``C`` is the compute the
baseline's curve needs to reach the variant's loss there, divided by ``C`` (Kimi's *Attention Residuals*
reports 1.25×): ``C_b = (A_b / (L_v(C) − E_b))^(1/α_b)``; where the variant's loss is below the baseline's
floor ``E_b`` no compute reaches it, and the multiplier is unbounded.

A three-parameter law needs at least four sizes (one degree of freedom left); with fewer the section says so
and gives no number.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MIN_SIZES = 4  # three parameters, and one degree of freedom to judge them by
BOOTSTRAP = 400  # replicates: percentile intervals at 95% move by well under their width between draws
LEVEL = 0.95
EXTRAPOLATE = (10.0, 100.0)  # multiples of the ladder's largest compute the multiplier is also given at


def law(c: np.ndarray, e: float, a: float, alpha: float) -> np.ndarray:
    """``E + A · c^(−α)``."""
    return e + a * np.power(c, -alpha)


@dataclass
class Fit:
    """One variant's fitted law; ``A`` in the units of compute in FLOPs. ``reason`` says why there is none."""

    variant: str
    points: int
    sizes: int
    e: float = math.nan
    a: float = math.nan
    alpha: float = math.nan
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    replicates: list[tuple[float, float, float]] = field(default_factory=list)
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason

    def loss(self, compute: np.ndarray | float) -> np.ndarray:
        return law(np.asarray(compute, dtype=float), self.e, self.a, self.alpha)


def _fit_points(compute: np.ndarray, loss: np.ndarray) -> tuple[float, float, float] | None:
    """(E, A, α) with compute in FLOPs, or None when the least-squares fit does not converge."""
    from scipy.optimize import curve_fit

    scale = float(compute.min())
    c = compute / scale
    low = float(loss.min())
    guess = (max(0.0, low - 0.1 * (float(loss.max()) - low) - 1e-3), max(float(loss.max()) - low, 1e-3), 0.3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (e, a, alpha), _ = curve_fit(law, c, loss, p0=guess, bounds=([0.0, 0.0, 1e-4], [low, np.inf, 5.0]),
                                         maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    if not all(map(math.isfinite, (e, a, alpha))):
        return None
    return float(e), float(a) * scale ** float(alpha), float(alpha)


def fit_variant(runs: pd.DataFrame, variant: str, bootstrap: int = BOOTSTRAP, seed: int = 0) -> Fit:
    """Fit one variant's runs (columns ``compute``, ``loss``, ``size``); intervals from a bootstrap over seeds."""
    mine = runs[runs["variant"] == variant]
    sizes = mine["size"].nunique()
    fit = Fit(variant, len(mine), sizes)
    if sizes < MIN_SIZES:
        fit.reason = (f"{sizes} size{'s' * (sizes != 1)}: too few points for a fit (a three-parameter law needs "
                      f"at least {MIN_SIZES} sizes)")
        return fit
    point = _fit_points(mine["compute"].to_numpy(float), mine["loss"].to_numpy(float))
    if point is None:
        fit.reason = "the least-squares fit did not converge"
        return fit
    fit.e, fit.a, fit.alpha = point
    groups = [g for _, g in mine.groupby("size")]
    if all(len(g) < 2 for g in groups):
        return fit  # one seed a size: nothing to resample, no interval
    rng = np.random.default_rng(seed)
    for _ in range(bootstrap):
        draw = pd.concat([g.iloc[rng.integers(0, len(g), len(g))] for g in groups])
        got = _fit_points(draw["compute"].to_numpy(float), draw["loss"].to_numpy(float))
        if got is not None:
            fit.replicates.append(got)
    if len(fit.replicates) >= bootstrap // 2:
        arr = np.array(fit.replicates)
        tail = (1 - LEVEL) / 2 * 100
        for i, name in enumerate(("e", "a", "alpha")):
            lo, hi = np.percentile(arr[:, i], [tail, 100 - tail])
            fit.intervals[name] = (float(lo), float(hi))
    return fit


def equivalent_compute(base: tuple[float, float, float], loss: np.ndarray) -> np.ndarray:
    """The compute at which a law (E, A, α) reaches ``loss`` (inf where the loss is at or below E)."""
    e, a, alpha = base
    gap = np.asarray(loss, dtype=float) - e
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(gap > 0, np.power(a / np.where(gap > 0, gap, 1.0), 1.0 / alpha), np.inf)


def multiplier(variant: Fit, base: Fit, compute: float) -> tuple[float, tuple[float, float] | None]:
    """The variant's compute-equivalent multiplier against the baseline at ``compute``, and its bootstrap interval
    (replicates of the two fits paired by index: each was drawn independently)."""
    at = float(equivalent_compute((base.e, base.a, base.alpha), variant.loss(compute)) / compute)
    n = min(len(variant.replicates), len(base.replicates))
    if n < BOOTSTRAP // 4:
        return at, None
    v = np.array(variant.replicates[:n])
    b = np.array(base.replicates[:n])
    lv = law(np.full(n, compute), v[:, 0], v[:, 1], v[:, 2])
    gap = lv - b[:, 0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        eq = np.where(gap > 0, np.power(b[:, 1] / np.where(gap > 0, gap, 1.0), 1.0 / b[:, 2]), np.inf) / compute
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(eq, [tail, 100 - tail])
    return at, (float(lo), float(hi))


def fits(runs: pd.DataFrame, bootstrap: int = BOOTSTRAP) -> dict[str, Fit]:
    """Every variant's fit, in the order the variants first appear."""
    return {v: fit_variant(runs, v, bootstrap) for v in dict.fromkeys(runs["variant"])}


def _num(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{x:.4g}"


def _interval(fit: Fit, name: str) -> str:
    lo_hi = fit.intervals.get(name)
    return f"[{_num(lo_hi[0])}, {_num(lo_hi[1])}]" if lo_hi else "—"


def fit_table(found: dict[str, Fit]) -> pd.DataFrame:
    """One row per variant: points, sizes, E, A, α with their intervals (or why there is no fit)."""
    rows = []
    for f in found.values():
        row = {"variant": f.variant, "runs": f.points, "sizes": f.sizes}
        if f.ok:
            row |= {"E": _num(f.e), "E 95%": _interval(f, "e"), "A": _num(f.a), "A 95%": _interval(f, "a"),
                    "α": _num(f.alpha), "α 95%": _interval(f, "alpha"), "note": "" if f.intervals else
                    "one seed a size: no interval (add seeds)"}
        else:
            row |= {"E": "—", "E 95%": "—", "A": "—", "A 95%": "—", "α": "—", "α 95%": "—", "note": f.reason}
        rows.append(row)
    return pd.DataFrame(rows)


def _times(x: float) -> str:
    return "unbounded" if math.isinf(x) else f"{x:.3g}×"


def multiplier_table(runs: pd.DataFrame, found: dict[str, Fit], baseline: str) -> pd.DataFrame:
    """Each variant's compute-equivalent multiplier against the baseline at each ladder size (the variant's own
    compute there) and extrapolated to 10× and 100× the largest compute; '—' where either law is missing."""
    base = found.get(baseline)
    rows = []
    for name, f in found.items():
        if name == baseline:
            continue
        mine = runs[runs["variant"] == name]
        at = {str(size): float(g["compute"].median()) for size, g in mine.groupby("size", sort=False)}
        top = float(runs["compute"].max())
        at |= {f"{k:g}× largest": top * k for k in EXTRAPOLATE}
        row: dict[str, str] = {"variant": name}
        for label, compute in at.items():
            if base is None or not base.ok or not f.ok:
                row[label] = "—"
                continue
            value, ci = multiplier(f, base, compute)
            row[label] = _times(value) + (f" [{_times(ci[0])}, {_times(ci[1])}]" if ci else "")
        rows.append(row)
    return pd.DataFrame(rows)


def section(runs: pd.DataFrame, baseline: str, figure: str | None = None, bootstrap: int = BOOTSTRAP) -> str:
    """The report's Scaling section in markdown."""
    if runs.empty:
        return "## Scaling\n\nNo finished run of a ladder in this scope yet (`attnres scale` launches one).\n"
    found = fits(runs, bootstrap)
    lines = ["## Scaling", "",
             f"L(C) = E + A·C^(−α) fitted per variant to each finished run's last eval loss against its training "
             f"compute C in FLOPs (6·N·tokens plus attention and the depth attention's own cost); 95% intervals "
             f"from {bootstrap} bootstrap draws over seeds. A fit needs at least {MIN_SIZES} sizes.", "",
             fit_table(found).to_markdown(index=False), ""]
    if baseline in found:
        lines += [f"### Compute-equivalent multiplier vs {baseline}", "",
                  "The compute the baseline's curve needs to reach each variant's loss, divided by the variant's "
                  "compute (above 1×: the variant is worth more compute than it costs); 95% bootstrap interval.", "",
                  multiplier_table(runs, found, baseline).to_markdown(index=False), ""]
    else:
        lines += [f"No run of the baseline '{baseline}' in the ladder: no multiplier.", ""]
    if figure:
        lines += [f"![Loss against compute]({figure})", ""]
    return "\n".join(lines)


def figure(runs: pd.DataFrame, found: dict[str, Fit]) -> object:
    """Loss against compute on log axes: each run a point, each fitted law a line (extended to 10× the ladder)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    lo, hi = float(runs["compute"].min()), float(runs["compute"].max()) * EXTRAPOLATE[0]
    grid = np.geomspace(lo, hi, 200)
    for i, (name, f) in enumerate(found.items()):
        color = f"C{i % 10}"
        mine = runs[runs["variant"] == name]
        ax.scatter(mine["compute"], mine["loss"], color=color, s=18, label=f"{name} ({len(mine)} runs)")
        if f.ok:
            ax.plot(grid, f.loss(grid), color=color, lw=1.5,
                    label=f"{name}: E={f.e:.3g}, α={f.alpha:.3g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training compute (FLOPs)")
    ax.set_ylabel("eval loss")
    ax.set_title("Scaling: L(C) = E + A·C^(−α)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
