"""Seeds per arm from exact power: the noncentral t behind every "~N seeds per arm" a document, ``compare`` or
a plan prints, and the spread's upper confidence bound a plan is made at. Pure functions of numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import stats

ALPHA, POWER = 0.05, 0.8  # the document's α (split between its families: reports.evidence) and a plan's power


def _two_sided(df: np.ndarray | float, nc: np.ndarray | float, alpha: float) -> np.ndarray:
    """Power of a two-sided t-test with ``df`` degrees of freedom at noncentrality ``nc`` (noncentral t), elementwise:
    a seed-count search asks for many counts in one call (scipy's per-call overhead, not the maths, is its cost).

    scipy's noncentral t returns NaN for some far tails (the lower one, against a large noncentrality,
    where the probability is below 1e-30): such a tail counts as 0 (its complement as 1), so a large
    effect gets its power of about 1 instead of a NaN that would stop the search for a seed count.
    """
    df, nc = np.broadcast_arrays(np.asarray(df, dtype=float), np.asarray(nc, dtype=float))
    crit = stats.t.ppf(1 - alpha / 2, df)
    upper = np.asarray(stats.nct.sf(crit, df, nc), dtype=float)
    bad = ~np.isfinite(upper)
    if bad.any():
        upper = upper.copy()
        upper[bad] = 1.0 - np.asarray(stats.nct.cdf(crit[bad], df[bad], nc[bad]), dtype=float)
        still = ~np.isfinite(upper)
        upper[still] = np.where(nc[still] > crit[still], 1.0, 0.0)
    lower = np.asarray(stats.nct.cdf(-crit, df, nc), dtype=float)
    return np.minimum(1.0, upper + np.where(np.isfinite(lower), lower, 0.0))


def _t_powers(n: np.ndarray, effect: float, alpha: float) -> np.ndarray:
    return _two_sided(2 * n - 2, abs(effect) * np.sqrt(n / 2), alpha)


def _paired_powers(n: np.ndarray, effect: float, alpha: float) -> np.ndarray:
    return _two_sided(n - 1, abs(effect) * np.sqrt(n), alpha)


def t_power(n: int, effect: float, alpha: float = ALPHA) -> float:
    """Exact power of a two-sided two-sample t-test with ``n`` per arm at standardized ``effect``
    (noncentral t with 2n - 2 degrees of freedom)."""
    return float(_t_powers(np.asarray(float(n)), effect, alpha))


def paired_power(n: int, effect: float, alpha: float = ALPHA) -> float:
    """Exact power of a two-sided paired t-test over ``n`` pairs at ``effect`` = Δ / σ of the differences
    (noncentral t with n - 1 degrees of freedom: statsmodels' ``TTestPower``)."""
    return float(_paired_powers(np.asarray(float(n)), effect, alpha))


WINDOW = 16  # seed counts a search evaluates in one call, doubled while the answer is not inside


def _smallest(powers: Callable[[np.ndarray], np.ndarray], start: int, power: float, limit: int) -> float:
    """The smallest n >= 2 with power ``powers(n) >= power`` (power rises with n; ``powers`` takes an array of
    counts), searched in windows around ``start``: one or two scipy calls, whatever the count; inf past ``limit``."""
    start = int(min(limit, max(2, start)))
    lo, width = max(2, start - 4), WINDOW
    enough: int | None = None  # the smallest count known to be enough
    while True:
        hi = min(limit, lo + width - 1) if enough is None else enough - 1
        counts = np.arange(lo, hi + 1, dtype=float)
        ok = np.flatnonzero(powers(counts) >= power)  # (never empty: below a count found enough, lo < it)
        if len(ok):
            enough = int(counts[ok[0]])
            if ok[0] > 0 or lo == 2:
                return float(enough)
            lo, width = max(2, lo - width), width * 2  # the normal approximation overshot: look below
        elif enough is not None:
            return float(enough)
        elif hi >= limit:
            return math.inf
        else:
            lo, width = hi + 1, width * 2


def seeds_needed(delta: float, std_a: float, std_b: float, alpha: float = ALPHA, power: float = POWER,
                 limit: int = 100_000) -> float:
    """Seeds per arm for a two-sample t-test (α, power) to detect ``delta`` with the observed spread.

    The spread is the pooled std of the arms that have one (NaN when neither does: one seed per arm
    cannot estimate it). Exact, from the noncentral t; never below 2 (a test needs 2 per arm).
    """
    sds = [s for s in (std_a, std_b) if s == s and not math.isinf(s)]
    if not sds or not math.isfinite(delta) or delta == 0:
        return math.nan
    sigma = math.sqrt(sum(s * s for s in sds) / len(sds))
    if sigma == 0:
        return 2.0
    effect = abs(delta) / sigma
    # bracket from the normal approximation (the t-test needs a little more than the z-test), then bisect
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return _smallest(lambda n: _t_powers(n, effect, alpha), math.ceil(2 * (z / effect) ** 2), power, limit)


def pairs_needed(delta: float, sd_diff: float, alpha: float = ALPHA, power: float = POWER,
                 limit: int = 100_000) -> float:
    """Seeds per arm (pairs: the same seeds in both arms) for a paired t-test (α, power) to detect ``delta``
    when the per-seed differences have std ``sd_diff``; never below 2. NaN without a spread estimate."""
    if not math.isfinite(delta) or delta == 0 or not math.isfinite(sd_diff):
        return math.nan
    if sd_diff == 0:
        return 2.0
    effect = abs(delta) / sd_diff
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return _smallest(lambda n: _paired_powers(n, effect, alpha), math.ceil((z / effect) ** 2), power, limit)


#: the confidence of the spread's upper bound that a seed count is planned at. A σ from 2-4 seeds is often half
#: the true one, and a count from it then delivers far less than the power it states (measured by ``attnres
#: bench errors``' power design: 62% at d = 0.67 from a pilot of 3 planned at σ as observed). Planned at this
#: bound, the plans made deliver ≥ 0.8 for d ≥ 0.5 (docs/benchmarks.md).
UPPER = 0.9


def sd_upper(sd: float, df: float, confidence: float = UPPER) -> float:
    """The one-sided upper confidence bound of a std estimated with ``df`` degrees of freedom (chi-square):
    a spread from 2-4 seeds may well be twice what it seems, and a seed count resting on it with it."""
    if not (math.isfinite(sd) and df >= 1):
        return math.nan
    return sd * math.sqrt(df / stats.chi2.ppf(1 - confidence, df))
