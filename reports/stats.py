"""Statistics over runs: pure functions of DataFrames and arrays (no database, no I/O).

Conventions: a *run table* has one row per run (id, variant, seed, status, step, total_steps,
...); an *evals table* is long format (run_id, step, value). Runs that ended before the compared
step (diverged, stopped early, failed, killed) contribute their last eval, marked, as the results
document's "*Killed early at step 5000".
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats

from attnres.tracking.states import DIVERGED, EARLY, FAILED, KILLED, STOPPED

MARKS = {DIVERGED: "diverged", STOPPED: "stopped early", FAILED: "failed", KILLED: "killed"}
ALPHA, POWER = 0.05, 0.8


class ReportError(ValueError):
    """The data cannot support the requested report (no runs, no baseline, no common step)."""


def finite(evals: pd.DataFrame) -> pd.DataFrame:
    """The evals with a finite value (a diverged run may have logged NaN or inf)."""
    return evals[np.isfinite(evals["value"].to_numpy(dtype=float))]


def _last_per_run(evals: pd.DataFrame, keep: str = "last") -> dict[int, tuple[float, int]]:
    """Each run's eval at its largest step (``keep="first"``: its smallest): run id -> (value, step)."""
    if evals.empty:
        return {}
    last = evals.sort_values(["run_id", "step"], kind="stable").drop_duplicates("run_id", keep=keep)
    return {int(r): (float(v), int(s)) for r, v, s in zip(last["run_id"], last["value"], last["step"], strict=True)}


def eval_at(runs: pd.DataFrame, evals: pd.DataFrame, step: int) -> pd.DataFrame:
    """Each run's eval loss at ``step``; early-ended runs give their last eval up to it, marked.

    Returns columns: run_id, variant, seed, status, eval, eval_step, mark (footnote text or "").
    Runs still going that have no eval at ``step`` are left out.
    """
    evals = finite(evals)
    steps = evals["step"].to_numpy()
    at = _last_per_run(evals[steps == step], keep="first")  # (value, step) per run, found in one pass each
    before = _last_per_run(evals[steps <= step])
    latest = _last_per_run(evals)
    rows = []
    for run in runs.itertuples(index=False):
        if run.status in EARLY and run.id in latest:  # marked even when it reached the step
            value, last = before.get(run.id, latest[run.id])
            ended = int(run.stop_step) if pd.notna(run.stop_step) else int(run.step)
            rows.append((run.id, run.variant, run.seed, run.status, value, last,
                         f"{MARKS[run.status].capitalize()} at step {ended}"))
        elif run.status not in EARLY and run.id in at:
            rows.append((run.id, run.variant, run.seed, run.status, at[run.id][0], step, ""))
    return pd.DataFrame(rows, columns=["run_id", "variant", "seed", "status", "eval", "eval_step", "mark"])


def mean_ci(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float, float]:
    """Mean, sample std, and the two-sided t confidence interval of the mean (NaN where undefined)."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n == 0:
        return (math.nan,) * 4
    mean = float(np.mean(values))
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    std = float(np.std(values, ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Welch's t statistic and two-sided p-value of mean(a) - mean(b); NaN unless both have 2+ values."""
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan
    if np.std(a) == 0 and np.std(b) == 0:  # no spread at all: any difference is certain, none is nothing
        diff = float(np.mean(a) - np.mean(b))
        return (math.copysign(math.inf, diff), 0.0) if diff else (math.nan, math.nan)
    with warnings.catch_warnings():  # nearly equal values: scipy warns of precision, the result stands
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_ind(a, b, equal_var=False)
    return float(res.statistic), float(res.pvalue)


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[int, float, float, float]:
    """Paired t-test over the seeds both arms have (same seed, same data order): (pairs, mean
    difference a - b, t, two-sided p). t and p are NaN below 2 pairs or without spread."""
    shared = sorted(set(a) & set(b))
    diffs = np.array([a[s] - b[s] for s in shared], dtype=float)
    if len(diffs) == 0:
        return 0, math.nan, math.nan, math.nan
    mean = float(diffs.mean())
    if len(diffs) < 2 or np.std(diffs) == 0:
        return len(diffs), mean, math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_rel([a[s] for s in shared], [b[s] for s in shared])
    return len(diffs), mean, float(res.statistic), float(res.pvalue)


def t_power(n: int, effect: float, alpha: float = ALPHA) -> float:
    """Exact power of a two-sided two-sample t-test with ``n`` per arm at standardized ``effect``
    (noncentral t with 2n - 2 degrees of freedom).

    scipy's noncentral t returns NaN for some far tails (the lower one, against a large noncentrality,
    where the probability is below 1e-30): such a tail counts as 0 (its complement as 1), so a large
    effect gets its power of about 1 instead of a NaN that would stop the search for a seed count.
    """
    df = 2 * n - 2
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = abs(effect) * math.sqrt(n / 2)
    upper = float(stats.nct.sf(crit, df, nc))
    if not math.isfinite(upper):
        upper = 1.0 - float(stats.nct.cdf(crit, df, nc))
    if not math.isfinite(upper):
        upper = 1.0 if nc > crit else 0.0
    lower = float(stats.nct.cdf(-crit, df, nc))
    return min(1.0, upper + (lower if math.isfinite(lower) else 0.0))


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
    # on the monotone exact power: a handful of noncentral-t evaluations, whatever the count
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    lo = int(min(limit, max(2, math.ceil(2 * (z / effect) ** 2))))
    hi = lo
    while t_power(hi, effect, alpha) < power:
        if hi >= limit:
            return math.inf
        lo, hi = hi + 1, min(limit, hi + 1 + hi // 8)
    while lo > 2 and t_power(lo - 1, effect, alpha) >= power:  # (the approximation overshot: rare)
        lo -= 1
        hi = lo
    while lo < hi:
        mid = (lo + hi) // 2
        if t_power(mid, effect, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return float(hi)


def versus(a: dict[int, float], b: dict[int, float]) -> dict[str, float]:
    """The difference of arm ``a`` from arm ``b`` (seed -> value), one test at a time: Δ of means, Welch t/p,
    the paired test over shared seeds and the seeds per arm to resolve it at α. ``compare`` and the
    Multi-Seed tables show these; a document's decisions (family-wise, sequential) are :mod:`reports.evidence`'s."""
    x, y = np.array(list(a.values()), dtype=float), np.array(list(b.values()), dtype=float)
    delta = float(np.mean(x) - np.mean(y)) if len(x) and len(y) else math.nan
    t, p = welch(x, y)
    pairs, pdelta, pt, pp = paired(a, b)
    need = seeds_needed(delta, mean_ci(x)[1], mean_ci(y)[1])
    return {"delta": delta, "t": t, "p": p, "n": len(x), "n_base": len(y), "pairs": pairs, "paired_delta": pdelta,
            "paired_t": pt, "paired_p": pp, "seeds_needed": need}


MAX_STARS = 5


def stars(delta: float) -> str:
    """The seed's scale: one ★ for any improvement plus one per 0.010 of it, down to the half star,
    at most five; ☆ for none."""
    if not math.isfinite(delta) or delta >= 0:
        return "☆"
    n = min(MAX_STARS, math.floor((1 + -delta / 0.01) * 2 + 1e-9) / 2)
    return "★" * int(n) + ("½" if n % 1 else "")


STARS_RULE = ("Quality: one ★ for any improvement over the baseline plus one per 0.010 of eval loss, "
              "down to the half star, at most five (−0.034 ★★★★, −0.025 ★★★½); ☆ is no improvement.")
