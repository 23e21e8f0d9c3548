"""When a scaling fit does not hold: the checks a ladder's law must pass before its multipliers are given.

Pure functions over the runs a fit takes (:func:`reports.scaling.ladder_runs`) and its fits. Three things can
make a fitted ``L(C) = E + A·C^(−α)`` say more than the ladder does:

* **the law does not describe the ladder** (a bending curve: a sum of two power laws fits a single law's
  three parameters to within a few hundredths of a nat, with E's interval far from the true floor). Where a
  size has two seeds or more, the seeds' spread at each size is a pure-error estimate of the noise, and the
  lack-of-fit F test compares it with how far the size means sit from the curve. A variant that fails it gets
  no multiplier at all;
* **the ladder does not decline**: a flat curve is fitted by any α with A near 0, so A and α say nothing. The
  loss must fall with log compute (a one-sided t test of the slope of loss on log10 compute, exact when the
  ladder is flat; a law's curvature only makes it conservative);
* **too few sizes to go past the ladder**: the law has three parameters, so ``sizes − 3`` residual degrees
  of freedom judge its shape. Sizes, not runs: seeds at one size share one compute, so they measure noise,
  never the shape, and 4 sizes × 10 seeds still leave one size to test three parameters with. Under
  :data:`MIN_DOF` the multipliers past the ladder's largest compute (its horizon) are withheld; at or above it
  they are given, and marked as extrapolations. With one seed a size there is no noise to judge the fit by:
  it is unchecked, and gives nothing past the ladder either.

Runs too short to be on a compute-efficient frontier (:func:`short_runs`) are a caveat, not a withholding: the
law then describes the recipe's losses (its warmup, its token budget), not the best loss at each compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats

from attnres.reports.scaling import BUDGET, Fit

#: each check's false-alarm rate on a curve the law describes: a comparison reads two curves, so one in about 20
#: comparisons of true laws is withheld (at 5% a curve it was one in 10; `attnres bench scaling` measures both)
LEVEL = 0.025
MIN_DOF = 2  # residual degrees of freedom (sizes − 3) an extrapolation needs
WARMUP_SHARE = 0.25  # warmup at or over this share of a run's steps: the schedule, not the model, set its loss
CHINCHILLA = 20.0  # tokens per non-embedding parameter at the compute-optimal point (Hoffmann et al., 2022)
FRONTIER_SHARE = 0.25  # a run under this share of CHINCHILLA's tokens per parameter is far from that frontier


@dataclass(frozen=True)
class Check:
    """One variant's checks. ``lof_p``: the lack-of-fit test's p (nan without two seeds at a size);
    ``slope_p``: the one-sided p that the loss does not fall with compute."""

    variant: str
    sizes: int
    dof: int  # residual degrees of freedom of the law's shape: sizes − 3
    pure_dof: int  # runs − sizes: the seeds' own degrees of freedom
    lof_f: float = math.nan
    lof_p: float = math.nan
    miss: float = math.nan  # RMS distance of the size means from the curve (nats)
    sigma: float = math.nan  # seed-to-seed standard deviation, pooled over sizes (nats)
    slope: float = math.nan  # loss per decade of compute (nats)
    slope_p: float = math.nan
    ends: tuple[str, float, str, float] = ("", math.nan, "", math.nan)  # smallest size, its mean, largest, its mean

    @property
    def checked(self) -> bool:
        """Whether seed noise could judge the fit (two seeds at some size, and a size more than parameters)."""
        return self.pure_dof >= 1 and self.dof >= 1 and math.isfinite(self.lof_p)

    @property
    def misfit(self) -> bool:
        return self.checked and self.lof_p < LEVEL

    @property
    def flat(self) -> bool:
        return not self.slope_p < LEVEL

    @property
    def fails(self) -> str:
        """Why the variant's multipliers are withheld ('' when they are not): a ladder that rises fails both
        checks, and is named by the one that says more of it."""
        return "no decline" if self.flat else "law misfits" if self.misfit else ""

    @property
    def far(self) -> str:
        """Why the variant's multipliers past the ladder are withheld ('' when they are given)."""
        if self.fails:
            return self.fails
        if self.dof < MIN_DOF:
            return f"{self.dof} residual dof"
        return "" if self.checked else "unchecked"


def _slope(compute: np.ndarray, loss: np.ndarray) -> tuple[float, float]:
    """Least-squares slope of loss on log10 compute and the one-sided p that it is not negative."""
    x = np.log10(compute)
    if len(x) < 3 or np.ptp(x) == 0:
        return math.nan, math.nan
    res = stats.linregress(x, loss)
    if not math.isfinite(res.stderr) or res.stderr == 0:
        return float(res.slope), 0.0 if res.slope < 0 else 1.0
    return float(res.slope), float(stats.t.cdf(res.slope / res.stderr, len(x) - 2))  # P(T ≤ t) under slope 0


def check_fit(runs: pd.DataFrame, fit: Fit) -> Check:
    """The checks of one variant's fit over its runs (columns ``size``, ``compute``, ``loss``)."""
    mine = runs[runs["variant"] == fit.variant]
    compute, loss = mine["compute"].to_numpy(float), mine["loss"].to_numpy(float)
    by_size = mine.groupby("size", sort=False)
    means = by_size["loss"].transform("mean").to_numpy(float)
    order = by_size["compute"].median().sort_values()
    mean_of = by_size["loss"].mean()
    ends = (str(order.index[0]), float(mean_of[order.index[0]]), str(order.index[-1]), float(mean_of[order.index[-1]]))
    slope, slope_p = _slope(compute, loss)
    sizes = int(mine["size"].nunique())
    base = Check(fit.variant, sizes, sizes - 3, len(mine) - sizes, slope=slope, slope_p=slope_p, ends=ends)
    if not fit.ok:
        return base
    pure = float(np.sum((loss - means) ** 2))
    lack = max(0.0, float(np.sum((loss - fit.loss(compute)) ** 2)) - pure)
    n_per = by_size["loss"].size().to_numpy(float)
    miss = math.sqrt(lack / float(n_per.sum()))  # (a size's points share its mean's miss: RMS over points)
    if base.pure_dof < 1 or base.dof < 1:
        return replace(base, miss=miss)
    sigma = math.sqrt(pure / base.pure_dof)
    # (seeds that agree exactly leave no noise: a miss past rounding is then a misfit, and none is none)
    f = (lack / base.dof) / (pure / base.pure_dof) if pure > 0 else math.inf if lack > 1e-12 * len(loss) else 0.0
    p = float(stats.f.sf(f, base.dof, base.pure_dof)) if math.isfinite(f) else 0.0
    return replace(base, lof_f=f, lof_p=p, miss=miss, sigma=sigma)


def check_all(runs: pd.DataFrame, found: dict[str, Fit]) -> dict[str, Check]:
    """Every fitted variant's checks, in the fits' order."""
    return {name: check_fit(runs, f) for name, f in found.items()}


def short_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs too short to be on a compute-efficient frontier, with why (``warmup``: warmup took at least
    :data:`WARMUP_SHARE` of the steps; ``tokens``: under :data:`FRONTIER_SHARE` × :data:`CHINCHILLA` tokens a
    non-embedding parameter). Rows of ``runs`` (which need ``steps``, ``warmup``, ``tokens`` and ``params``
    columns; without them nothing is flagged), with ``tokens_per_param`` and the two flags added."""
    if not set(BUDGET) <= set(runs.columns):
        return runs.iloc[0:0].assign(tokens_per_param=[], by_warmup=[], by_tokens=[])
    out = runs.assign(tokens_per_param=runs["tokens"] / runs["params"])
    out = out.assign(by_warmup=out["warmup"] >= WARMUP_SHARE * out["steps"],
                     by_tokens=out["tokens_per_param"] < FRONTIER_SHARE * CHINCHILLA)
    return out[out["by_warmup"] | out["by_tokens"]]
