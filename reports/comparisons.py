"""Which comparisons a document makes, each tested once (:mod:`reports.evidence`). Pure.

* every variant of a comparison group against the baseline, at the group's step (primary family);
* the two best variants of the main table against each other: is the first really ahead (primary);
* the contrasts that isolate a mechanism (:func:`attnres.variants.traits.contrasts`): a variant against the
  variant it adds one trait to (or several, confounded), at the latest step both have (secondary).

A variant whose runs all ended early is compared at its last eval, with what it is compared against
at that same step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from attnres.reports import identity
from attnres.reports.evidence import (
    BASELINE,
    CONTRAST,
    TOP_TWO,
    Comparison,
    assess,
    control,
    going,
    pooled_sd,
    stage_of,
)
from attnres.reports.scope import choose
from attnres.reports.stats import ReportError, finite
from attnres.reports.tables import per_variant
from attnres.tracking.states import EARLY
from attnres.variants import traits


@dataclass
class Group:
    """A comparison group as the document compares it: its table at ``step`` (per_variant rows)."""

    table: pd.DataFrame
    step: int
    partial: bool


def _rows(table: pd.DataFrame) -> dict[str, pd.Series]:
    return {str(r["variant"]): r for _, r in table.iterrows() if not r["mark"]}


def _pair_step(runs: pd.DataFrame, evals: pd.DataFrame, a: str, b: str) -> int | None:
    """Where two variants outside one group's table meet: as a group would choose, or, when one of them
    only has runs that ended early, the latest eval step both have."""
    arms = runs[runs["variant"].isin([a, b])]
    early = any((arms.loc[arms["variant"] == v, "status"].isin(EARLY)).all() for v in (a, b))
    if not early:
        choice = choose(runs, evals, [a], b)
        return choice.step if choice is not None and a in choice.compared else None
    steps = finite(evals).merge(arms[["id", "variant"]], left_on="run_id", right_on="id")
    common = set(steps.loc[steps["variant"] == a, "step"]) & set(steps.loc[steps["variant"] == b, "step"])
    return max(common) if common else None


def document(runs: pd.DataFrame, evals: pd.DataFrame, baseline: str, budget: int, main: Group,
             deep: Group | None = None, plans: Mapping[int, dict] | None = None, future: int = 0
             ) -> list[Comparison]:
    """Every comparison of one document, tested, with family-wise control applied (``future``: primary
    comparisons the plan will add, which the seeds it plans must already allow for)."""
    out: list[Comparison] = []
    done: set[tuple[str, str]] = set()
    seen = {"stage": stage_of(runs), "live_runs": going(runs)}  # (the runs' stages and live runs: read once)
    groups = [(g, _rows(g.table)) for g in (main, deep) if g is not None]  # each group's rows, read once
    for group, rows in groups:
        if baseline not in rows:
            continue
        ranked = group.table[group.table["mark"] == ""].sort_values("eval", kind="stable")
        for v in ranked["variant"]:
            if v != baseline and (v, baseline) not in done:
                out.append(assess(Comparison(v, baseline, BASELINE, group.step, group.partial),
                                  rows[v], rows[baseline], runs, plans, **seen))
                done.add((v, baseline))
    ranked = [v for v in main.table[main.table["mark"] == ""].sort_values("eval", kind="stable")["variant"]
              if v != baseline]
    if len(ranked) >= 2:
        rows = groups[0][1]
        out.append(assess(Comparison(ranked[0], ranked[1], TOP_TWO, main.step, main.partial),
                          rows[ranked[0]], rows[ranked[1]], runs, plans, **seen))
        done |= {(ranked[0], ranked[1]), (ranked[1], ranked[0])}
    same = identity.same_models(runs, prefer=[baseline])  # one model under two names: no contrast of its traits
    for a, b, added in traits.contrasts(sorted(set(runs["variant"]))):
        if (a, b) in done or (b, a) in done or a in same or b in same:  # (another baseline's primary test)
            continue
        done.add((a, b))
        group, rows = next(((g, r) for g, r in groups if {a, b} <= set(r)), (None, {}))
        if group is not None:
            step, partial = group.step, group.partial
        else:
            step = _pair_step(runs, evals, a, b)
            if step is None:
                out.append(Comparison(a, b, CONTRAST, 0, traits=added))  # no eval of both: not yet testable
                continue
            try:
                table = per_variant(runs, evals, step, [a, b], baseline)
            except ReportError:
                continue
            rows, partial = {str(r["variant"]): r for _, r in table.iterrows()}, step < budget
            if set(rows) != {a, b}:
                out.append(Comparison(a, b, CONTRAST, step, partial, traits=added))
                continue
        out.append(assess(Comparison(a, b, CONTRAST, step, partial, traits=added), rows[a], rows[b], runs, plans,
                          **seen))
    for c in out:
        c.interim = c.step != budget
    return control(out, pooled_sd(main.table), future=future)
