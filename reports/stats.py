"""Statistics over runs: pure functions of DataFrames (no database, no I/O).

Conventions: a *run table* has one row per run (id, variant, seed, status, ...); an *evals
table* is long format (run_id, step, value). Runs that ended before the compared step
(diverged, stopped early, failed, killed) contribute their last eval, marked, as the results
document's "*Killed early at step 5000".
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from attnres.tracking.states import DIVERGED, EARLY, FAILED, KILLED, STOPPED

MARKS = {DIVERGED: "diverged", STOPPED: "stopped early", FAILED: "failed", KILLED: "killed"}


class ReportError(ValueError):
    """The data cannot support the requested report (no runs, no baseline, no common step)."""


def common_step(runs: pd.DataFrame, evals: pd.DataFrame) -> int:
    """The largest eval step that every run still in the comparison (not ended early) reached."""
    live = runs[~runs["status"].isin(EARLY)]
    if live.empty:
        raise ReportError("no runs to compare (every run ended early)")
    steps = [set(evals.loc[evals["run_id"] == rid, "step"]) for rid in live["id"]]
    shared = set.intersection(*steps) if steps else set()
    if not shared:
        raise ReportError("the runs share no eval step; pass --step or wait for more evals")
    return int(max(shared))


def eval_at(runs: pd.DataFrame, evals: pd.DataFrame, step: int) -> pd.DataFrame:
    """Each run's eval loss at ``step``; early-ended runs give their last eval, marked.

    Returns columns: run_id, variant, seed, status, eval, eval_step, mark (footnote text or "").
    Runs still going that have not reached ``step`` are left out.
    """
    rows = []
    for run in runs.itertuples(index=False):
        curve = evals[evals["run_id"] == run.id].sort_values("step")
        at = curve[curve["step"] == step]
        if run.status in EARLY and len(curve):  # marked even when it reached the step
            before = curve[curve["step"] <= step]
            last = before.iloc[-1] if len(before) else curve.iloc[-1]
            ended = int(run.stop_step) if pd.notna(run.stop_step) else int(run.step)
            rows.append((run.id, run.variant, run.seed, run.status, float(last["value"]), int(last["step"]),
                         f"{MARKS[run.status].capitalize()} at step {ended}"))
        elif len(at):
            rows.append((run.id, run.variant, run.seed, run.status, float(at["value"].iloc[0]), step, ""))
    return pd.DataFrame(rows, columns=["run_id", "variant", "seed", "status", "eval", "eval_step", "mark"])


def mean_ci(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float, float]:
    """Mean, sample std, and the two-sided t confidence interval of the mean."""
    values = np.asarray(values, dtype=float)
    n, mean = len(values), float(np.mean(values))
    if n < 2:
        return mean, float("nan"), float("nan"), float("nan")
    std = float(np.std(values, ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Welch's t statistic and two-sided p-value of mean(a) - mean(b); NaN when undefined."""
    if len(a) < 2 or len(b) < 2:
        return float("nan"), float("nan")
    res = stats.ttest_ind(a, b, equal_var=False)
    return float(res.statistic), float(res.pvalue)


def seeds_to_resolve(delta: float, std_a: float, std_b: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Seeds per arm for a two-sample test to detect ``delta`` (normal approximation).

    n = 2 * ((z_{1-alpha/2} + z_{power}) * sigma / |delta|)^2, with sigma the root mean square
    of the two arms' standard deviations (one arm's alone when the other has a single seed).
    """
    sds = [s for s in (std_a, std_b) if not math.isnan(s)]
    if not sds or delta == 0:
        return float("nan")
    sigma = math.sqrt(sum(s * s for s in sds) / len(sds))
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return float(math.ceil(2 * (z * sigma / abs(delta)) ** 2))


MAX_STARS = 5


def stars(delta: float) -> str:
    """One star per 0.01 of eval-loss improvement, to the nearest half star, at most 5; ☆ for none."""
    n = min(MAX_STARS, round(-delta / 0.01 * 2) / 2)
    if n <= 0:
        return "☆"
    return "★" * int(n) + ("½" if n % 1 else "")
