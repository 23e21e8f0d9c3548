"""``--tuned KEY``: every variant compared at its own best value of a swept setting. Pure functions.

A fair comparison of two residual paths gives each its best learning rate (or warmup, ...), not one
rate that suits one of them. For each variant this picks the value with the lowest mean eval loss over
seeds at the latest eval step that every value of that variant reached, keeps that value's runs, and
says what won and where. The pick and the comparison use the same held-out eval, so the tuned numbers
are a little optimistic (a winner's curse that shrinks with more seeds); the table shows every value,
so a reader sees how close the runners-up were.
"""

from __future__ import annotations

import math

import pandas as pd

from attnres import run_settings
from attnres.reports.escape import markdown_table
from attnres.reports.stats import ReportError, finite
from attnres.runs import grid
from attnres.tracking.states import EARLY, FINISHED


def _step(evals: pd.DataFrame, runs: pd.DataFrame) -> int | None:
    """The latest eval step that every one of ``runs`` with an eval has (None: they share none)."""
    have = [set(evals.loc[evals["run_id"] == rid, "step"]) for rid in runs["id"]]
    have = [h for h in have if h]
    shared = set.intersection(*have) if have else set()
    return max(shared) if shared else None


def tune(runs: pd.DataFrame, evals: pd.DataFrame, key: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the runs of each variant's best value of ``key``, the table of every value with the winner marked).

    A value is ranked by its mean eval loss over seeds at the latest eval step that every run of the
    variant's *sound* values has reached: a value whose runs ended early (diverged, stopped, killed,
    failed) does not hold the others back to its last eval, and ranks after every sound value (a
    learning rate at which one seed of two diverged is not a winner); a run with no eval yet (queued)
    holds nothing back. The step is said in the table, partial while sound runs are short of their budget.
    """
    evals = finite(evals)
    value = pd.Series([run_settings.settings(c).get(key, "—") for c in runs["config_json"]], index=runs.index)
    kept, rows = [], []
    for variant, mine in runs.groupby("variant", sort=False):
        by_value = {v: mine[value[mine.index] == v] for v in sorted(set(value[mine.index]), key=_order)}
        early = {v: int(g["status"].isin(EARLY).sum()) for v, g in by_value.items()}
        sound = mine[~mine["status"].isin(EARLY)]
        step = _step(evals, sound if len(sound) else mine)
        scores = {}
        for v, group in by_value.items():
            at = evals[evals["run_id"].isin(group["id"]) & (evals["step"] == step)]["value"]
            scores[v] = (float(at.mean()) if len(at) else math.nan, len(at))
        ranked = sorted((v for v in by_value if not math.isnan(scores[v][0])),
                        key=lambda v: (early[v] > 0, scores[v][0]))
        if not ranked:
            raise ReportError(f"--tuned {key}: {variant} has no eval loss that all its {key} values reached")
        best = ranked[0]
        kept.append(by_value[best])
        partial = step is not None and bool(len(sound)) and bool((sound["status"] != FINISHED).any())
        for v in by_value:
            mean, seeds = scores[v]
            rows.append({"Variant": variant, key: v, "Seeds": f"{seeds} of {len(by_value[v])}",
                         "Ended early": str(early[v]) if early[v] else "—",
                         "Eval step": "—" if step is None else f"{step:,}" + (" (partial)" if partial else ""),
                         "Eval loss": "n/a" if math.isnan(mean) else f"{mean:.4f}",
                         "Picked": "best" if v == best else ""})
    return pd.concat(kept).sort_index(), pd.DataFrame(rows)


def _order(value: str) -> tuple[int, float | str]:
    """Numbers in numeric order, then words."""
    try:
        return 0, float(value)
    except ValueError:
        return 1, value


def tuning_markdown(table: pd.DataFrame, key: str) -> str:
    """The document's section that says which value of ``key`` each variant is compared at, and why."""
    winners = table[table["Picked"] == "best"]
    picked = "; ".join(f"{r['Variant']} at {key}={r[key]}" for _, r in winners.iterrows())
    return (f"## Tuning of {key}\n\nEach variant is compared at its best {key}: the value with the lowest mean eval "
            f"loss (held-out data) over its seeds, at the latest eval step every value of that variant reached "
            f"(values whose runs ended early rank last and do not hold that step back). "
            f"Picked: {picked}. The pick and the comparison below use the same eval, so the tuned losses are "
            f"slightly optimistic; the runners-up are listed.\n\n"
            + markdown_table(table, disable_numparse=True) + "\n")


def cells_as_arms(runs: pd.DataFrame, key: str, default: str | None) -> tuple[pd.DataFrame, str, str]:
    """One variant swept over ``key``: its values become the compared arms (``control_block@lr=0.001``), the
    baseline being the arm at ``default`` (the value the variant trains with unless told otherwise), or, where
    that value was not run, the value nearest it (in log scale for positive numbers). Returns the runs
    relabelled, the baseline arm and a sentence saying so."""
    variant = str(runs["variant"].iloc[0])
    values = [run_settings.settings(c).get(key) for c in runs["config_json"]]
    held = sorted({v for v in values if v is not None}, key=_order)
    if len(held) < 2:
        raise ReportError(f"--tuned {key}: {variant} has one value of {key} here")

    def distance(v: str) -> float:
        try:
            a, b = float(v), float(default or "nan")
        except ValueError:
            return math.inf
        if a > 0 and b > 0:
            return abs(math.log(a / b))
        return abs(a - b) if math.isfinite(a - b) else math.inf

    base = default if default in held else min(held, key=distance)
    labels = [grid.arm_label(variant, {key: v}) if v is not None else variant for v in values]
    why = ("its default" if base == default else f"the value nearest its default {key}={default}"
           if default is not None else "the first value")
    note = (f"Only {variant} was run here, over {len(held)} values of {key}: each value is an arm, compared "
            f"against {grid.arm_label(variant, {key: base})} ({why}).")
    return runs.assign(variant=labels), grid.arm_label(variant, {key: base}), note


def _order(v: str) -> tuple[int, float, str]:
    try:
        return (0, float(v), v)
    except ValueError:
        return (1, 0.0, v)
