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

from attnres.reports.power import ALPHA, UPPER, pairs_needed, sd_upper, seeds_needed
from attnres.tracking.states import DIVERGED, EARLY, FAILED, INCOMPLETE, KILLED, STOPPED

MARKS = {DIVERGED: "diverged", STOPPED: "stopped early", FAILED: "failed", KILLED: "killed",
         INCOMPLETE: "incomplete (logged steps missing from the database)"}


class ReportError(ValueError):
    """The data cannot support the requested report (no runs, no baseline, no common step)."""


# The largest eval loss a report computes with. A language model's loss is tens at most (ln of the vocabulary at
# initialisation); a value beyond this is a unit or import mistake, and it would break the arithmetic: squares
# and sums of values near 1e308 overflow to inf (an interval of ±inf), and their differences cancel (a mean of
# 0.000). Below it, the squares of the spread (1e300) and sums of millions of them stay finite.
LARGEST = 1e150


def finite(evals: pd.DataFrame) -> pd.DataFrame:
    """The evals with a finite value (a diverged run may have logged NaN or inf).

    Every report's statistics start from here, so a value too large to compute with (:data:`LARGEST`) is
    refused here, naming its run, rather than averaged into a wrong figure."""
    values = evals["value"].to_numpy(dtype=float)
    ok = np.isfinite(values)
    huge = ok & (np.abs(np.where(ok, values, 0.0)) > LARGEST)
    if huge.any():
        at = int(np.argmax(huge))
        raise ReportError(f"run {int(evals['run_id'].iloc[at])}'s eval loss at step {int(evals['step'].iloc[at])} "
                          f"is {values[at]:.3g}: eval loss values beyond ±1e150 are too large to average; "
                          "correct or remove the run's values")
    return evals[ok]


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


def holm(pvals: list[float] | np.ndarray, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """Holm–Bonferroni: (reject, adjusted p) in the order given; the same figures as statsmodels'
    ``multipletests(method="holm")`` (a test holds them equal), which calls ``gc.collect()`` on every call:
    0.1 s and more in a report's heap, once per family and document, where the arithmetic is microseconds."""
    p = np.asarray(pvals, dtype=float)
    order = np.argsort(p, kind="mergesort")
    steps = np.arange(len(p), 0, -1)
    adjusted_sorted = np.minimum(1.0, np.maximum.accumulate(p[order] * steps))
    over = np.nonzero(p[order] > alpha / steps)[0]
    reject_sorted = np.arange(len(p)) < (over[0] if over.size else len(p))
    adjusted, reject = np.empty_like(p), np.empty(len(p), dtype=bool)
    adjusted[order], reject[order] = adjusted_sorted, reject_sorted
    return reject, adjusted


def shown(delta: float, digits: int = 3) -> float:
    """``delta`` as a document prints it (rounded; no negative zero): stars and labels derive from this
    figure, so a label never disagrees with the number printed beside it."""
    return round(delta, digits) + 0.0 if math.isfinite(delta) else delta


PAIRED, WELCH = "paired", "Welch"


def design(a: dict[int, float], b: dict[int, float]) -> str:
    """The test two arms get: PAIRED when both hold the same 2+ seeds (same seed, same data order: the
    per-seed differences carry the comparison), else WELCH over every seed of each arm."""
    return PAIRED if len(a) >= 2 and set(a) == set(b) else WELCH


def test_p(a: dict[int, float], b: dict[int, float]) -> float:
    """The two-sided p-value of the arms' difference under :func:`design` (NaN where untestable)."""
    if design(a, b) == PAIRED:
        return paired(a, b)[3]
    return welch(np.array(list(a.values()), dtype=float), np.array(list(b.values()), dtype=float))[1]


def flat(a: dict[int, float], b: dict[int, float]) -> bool:
    """No spread to test with: a paired design's differences are all equal, or neither arm varies."""
    if design(a, b) == PAIRED:
        return bool(np.ptp([a[s] - b[s] for s in a]) == 0)
    return bool(len(a) >= 2 and len(b) >= 2 and np.ptp(list(a.values())) == 0 and np.ptp(list(b.values())) == 0)


def interval(a: dict[int, float], b: dict[int, float], confidence: float = 1 - ALPHA) -> tuple[float, float]:
    """The ``confidence`` interval of mean(a) - mean(b) for the test the arms get (:func:`design`): the paired
    t-interval of the per-seed differences, else Welch's (Welch-Satterthwaite degrees of freedom); scipy's
    ``confidence_interval``. NaN where the test is undefined (below 2 seeds per arm, or no spread at all)."""
    if len(a) < 2 or len(b) < 2 or flat(a, b) or not 0 < confidence < 1:
        return math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if design(a, b) == PAIRED:
            seeds = sorted(a)
            res = stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds])
        else:
            res = stats.ttest_ind(list(a.values()), list(b.values()), equal_var=False)
        ci = res.confidence_interval(confidence)
    return float(ci.low), float(ci.high)


def intervals(a: np.ndarray, b: np.ndarray, paired: bool, confidence: float = 1 - ALPHA
              ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`interval` for many steps at once: ``a`` and ``b`` are (steps x seeds) matrices of two arms' values
    (``paired``: the same seeds in the same columns), one row per step. The same t-intervals (paired over the
    differences, else Welch-Satterthwaite), as arrays, with one call of the t quantile: the Δ figure's band asks
    for one per step and variant, thousands in a long run. NaN rows where :func:`interval` gives NaN."""
    steps, n_a, n_b = a.shape[0], a.shape[1], b.shape[1]
    nan = np.full(steps, math.nan)
    if n_a < 2 or n_b < 2 or not 0 < confidence < 1:
        return nan, nan.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        if paired:
            d = a - b
            flat_rows = np.ptp(d, axis=1) == 0
            se, df = np.std(d, axis=1, ddof=1) / math.sqrt(n_a), np.full(steps, n_a - 1.0)
            mid = d.mean(axis=1)
        else:
            flat_rows = (np.ptp(a, axis=1) == 0) & (np.ptp(b, axis=1) == 0)
            va, vb = np.var(a, axis=1, ddof=1) / n_a, np.var(b, axis=1, ddof=1) / n_b
            se = np.sqrt(va + vb)
            df = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
            mid = a.mean(axis=1) - b.mean(axis=1)
        q = stats.t.ppf(0.5 + confidence / 2, df)
        lo, hi = mid - q * se, mid + q * se
    lo[flat_rows], hi[flat_rows] = math.nan, math.nan
    return lo, hi


def decision_confidence(p: float, p_decided: float, alpha: float = ALPHA) -> float:
    """The confidence of the interval that agrees with a decision: a test whose p-value enters its decision
    as ``p_decided`` (Holm-adjusted, after sequential looks) is decided at α exactly when its interval at
    1 - α·p/p_decided excludes 0, so a band drawn at this level never claims what the table rejects.
    1 - α where nothing adjusts the p-value."""
    if not (math.isfinite(p) and math.isfinite(p_decided)) or p_decided <= 0 or p <= 0:
        return 1 - alpha
    return 1 - alpha * min(1.0, p / p_decided)


def level_text(confidence: float) -> str:
    """'95%', '98.8%', '99.97%': two significant digits of what the level leaves out."""
    miss = (1 - confidence) * 100
    if not 0 < miss < 100:
        return "n/a"
    digits = max(0, math.ceil(-math.log10(miss)) + 1)
    text = f"{confidence * 100:.{digits}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "%"


def seed_plan(a: dict[int, float], b: dict[int, float], delta: float, alpha: float = ALPHA,
              pooled: tuple[float, int] = (math.nan, 0), complete: bool = False) -> dict[str, object]:
    """Seeds per arm to resolve ``delta`` at ``alpha`` with power 0.8, for the design the next test will have:
    planned at the spread's :data:`UPPER` upper confidence bound (``need``), so that a spread from few seeds,
    which is as often too small as too large, does not plan too few; the count at the spread as observed
    (``observed``) beside it.

    Arms holding the same 2+ seeds are planned paired (σ of the per-seed differences), as that is the
    test they get (:func:`design`) and a plan adds the same seeds to both; with ``complete`` (a plan gives each
    arm the seeds the other holds: :mod:`reports.pairs`), so are arms sharing 2+ seeds, from the differences
    over those, for at least the seeds the two hold between them; otherwise Welch with the arms'
    spread, or ``pooled`` (std, degrees of freedom: the scope's seed spread) when neither arm has two
    seeds. Returns design, need, observed, basis.
    """
    shared = sorted(set(a) & set(b))
    if complete and design(a, b) != PAIRED and len(shared) >= 2:
        diffs = np.array([a[s] - b[s] for s in shared], dtype=float)
        sd, df, least = float(np.std(diffs, ddof=1)), len(diffs) - 1, len(set(a) | set(b))
        observed, need = (max(float(least), x) if x == x else x
                          for x in (pairs_needed(delta, sd, alpha), pairs_needed(delta, sd_upper(sd, df), alpha)))
        return {"design": PAIRED, "need": need, "observed": observed,
                "basis": f"σ of {len(diffs)} paired differences, once each arm holds the other's seeds"}
    if design(a, b) == PAIRED:
        diffs = np.array([a[s] - b[s] for s in sorted(a)], dtype=float)
        sd, df = float(np.std(diffs, ddof=1)), len(diffs) - 1
        return {"design": PAIRED, "need": pairs_needed(delta, sd_upper(sd, df), alpha),
                "observed": pairs_needed(delta, sd, alpha),
                "basis": f"σ of {len(diffs)} paired differences"}
    sds = [(float(np.std(list(x.values()), ddof=1)), len(x) - 1) for x in (a, b) if len(x) >= 2]
    basis = "the arms' spread"
    if not sds and math.isfinite(pooled[0]):
        sds, basis = [(pooled[0], 0)], "the pooled spread"
    if not sds:
        return {"design": WELCH, "need": math.nan, "observed": math.nan, "basis": "no spread"}
    df = pooled[1] if basis == "the pooled spread" else sum(d for _, d in sds)
    sd = math.sqrt(sum(s * s for s, _ in sds) / len(sds))
    high = sd_upper(sd, df)
    return {"design": WELCH, "need": seeds_needed(delta, high, high, alpha),
            "observed": seeds_needed(delta, sd, sd, alpha), "basis": basis}


def need_text(need: float, observed: float = math.nan, how: str = "", unit: str = "") -> str:
    """'~9 (paired; power 0.8 with σ at its 90% upper bound; ~3 at σ as observed)', '~3', '> 100,000' or 'n/a';
    ``unit`` follows the count ('~9 seeds per arm (paired; ...)'). The first count is the plan (it keeps its
    stated power when the spread was underestimated); the one at σ as observed shows what the uncertainty costs."""
    if need != need:
        return "n/a"
    notes = [how] if how else []
    if math.isinf(need):
        return "> 100,000" + unit + (f" ({how})" if how else "")
    if observed == observed and observed < need:
        notes.append(f"power 0.8 with σ at its {UPPER:.0%} upper bound; ~{observed:,.0f} at σ as observed")
    return f"~{need:,.0f}{unit}" + (f" ({'; '.join(notes)})" if notes else "")


def versus(a: dict[int, float], b: dict[int, float]) -> dict[str, float]:
    """The difference of arm ``a`` from arm ``b`` (seed -> value), one test at a time: Δ of means, Welch t/p,
    the paired test over shared seeds and the seeds per arm to resolve it at α (:func:`seed_plan`).
    ``compare`` and the Multi-Seed tables show these; a document's decisions (family-wise, sequential) are
    :mod:`reports.evidence`'s."""
    x, y = np.array(list(a.values()), dtype=float), np.array(list(b.values()), dtype=float)
    delta = float(np.mean(x) - np.mean(y)) if len(x) and len(y) else math.nan
    t, p = welch(x, y)
    pairs, pdelta, pt, pp = paired(a, b)
    size = seed_plan(a, b, delta)
    return {"delta": delta, "t": t, "p": p, "n": len(x), "n_base": len(y), "pairs": pairs, "paired_delta": pdelta,
            "paired_t": pt, "paired_p": pp, "seeds_needed": size["need"], "seeds_observed": size["observed"],
            "design": size["design"]}


MAX_STARS = 5


def stars(delta: float) -> str:
    """The seed's scale: one ★ for any improvement plus one per 0.010 of it, down to the half star,
    at most five; ☆ for none. Applied to the Δ as printed (:func:`shown`)."""
    delta = shown(delta)
    if not math.isfinite(delta) or delta >= 0:
        return "☆"
    n = min(MAX_STARS, math.floor((1 + -delta / 0.01) * 2 + 1e-9) / 2)
    return "★" * int(n) + ("½" if n % 1 else "")


STARS_RULE = ("Quality: one ★ for any improvement over the baseline plus one per 0.010 of eval loss, "
              "down to the half star, at most five (−0.034 ★★★★, −0.025 ★★★½); ☆ is no improvement. Stars of an "
              "improvement not resolved against the baseline read ★★★★ (tentative).")
