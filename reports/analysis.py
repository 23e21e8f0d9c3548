"""One scope analysed once: the step each group is compared at, its table, every test, the verdicts, the
findings and the plan. The document (:mod:`reports.document`) renders it; ``attnres next`` prints and
launches its plan. Pure: DataFrames in, an :class:`Analysis` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from attnres.reports import comparisons, findings
from attnres.reports import next_plan as plans
from attnres.reports.evidence import BASELINE, TOP_TWO, Comparison
from attnres.reports.scope import Choice, Scope, choose
from attnres.reports.stats import ReportError
from attnres.reports.tables import per_variant
from attnres.reports.verdicts import cost_benefit


@dataclass
class Analysis:
    main: Choice
    table: pd.DataFrame  # the main group's per-variant rows at main.step
    deep: Choice | None
    deep_table: pd.DataFrame | None  # the deep group's rows (baseline included), attrs step/partial
    tests: list[Comparison]
    verdicts: pd.DataFrame
    findings: list[findings.Finding]
    plan: plans.Plan
    by_variant: dict[str, Comparison] = field(default_factory=dict)  # each variant's test against the baseline


def partial(choice: Choice, budget: int) -> bool:
    """A comparison made before its runs reached their budget (or at an earlier step asked for)."""
    return not choice.final and choice.step < budget


def too_early(runs: pd.DataFrame, baseline: str) -> str:
    """Why nothing can be compared yet: the baseline's runs have no eval after step 0 (how far they are)."""
    mine = runs[runs["variant"] == baseline]
    if mine.empty:
        return f"no runs of the baseline '{baseline}' in this scope; run it or pass --baseline"
    return (f"too early: no run of the baseline '{baseline}' has an eval after step 0 yet (furthest: step "
            f"{int(mine['step'].max()):,} of {int(mine['total_steps'].max()):,}); step 0 is the initialisation, "
            "not a result: report again after the first eval")


def analyse(runs: pd.DataFrame, evals: pd.DataFrame, scope: Scope, baseline: str, deep: list[str],
            step: int | None = None, launch_plans: Mapping[int, dict] | None = None,
            max_seeds: int = plans.MAX_SEEDS, db: list[str] | None = None, kinds: tuple[str, ...] = plans.KINDS,
            benches: pd.DataFrame | None = None, bench_args: list[str] | None = None) -> Analysis:
    """Analyse one scope's runs against ``baseline``; ``deep`` variants form their own group; ``db`` is the
    --db the plan's commands name; ``kinds`` the parts of the plan to be launched (with its never-run
    variants, the family its seed counts must allow for is larger); ``benches`` the stored bench sessions the
    cost figures may take a paired measurement from."""
    deep = [v for v in deep if v != baseline]
    shallow = [v for v in sorted(set(runs["variant"])) if v not in deep]
    main_runs = runs[runs["variant"].isin(shallow)]
    main = choose(main_runs, evals, shallow, baseline, step)
    if main is None:
        raise ReportError(too_early(runs, baseline))
    table = per_variant(main_runs, evals, main.step, None, baseline)
    group = comparisons.Group(table, main.step, partial(main, scope.budget))
    deep_choice, deep_table, deep_group = None, None, None
    deep_runs = runs[runs["variant"].isin([*deep, baseline])]
    if set(deep) & set(deep_runs["variant"]):
        deep_choice = choose(deep_runs, evals, deep, baseline)
        if deep_choice is not None and len(deep_choice.compared) >= 2:
            deep_table = per_variant(deep_runs, evals, deep_choice.step, deep_choice.compared, baseline)
            deep_table.attrs.update(step=deep_choice.step, partial=partial(deep_choice, scope.budget))
            deep_group = comparisons.Group(deep_table, deep_choice.step, partial(deep_choice, scope.budget))
    future = len(plans.never_run(runs, scope, baseline)[0]) if plans.NEW in kinds else 0  # joining the family
    tests = comparisons.document(runs, evals, baseline, scope.budget, group, deep_group, launch_plans, future)
    by_variant = {c.a: c for c in tests if c.kind == BASELINE}
    top = next((c for c in tests if c.kind == TOP_TWO), None)  # first against second: *Best quality*'s evidence
    verdicts = cost_benefit(table, baseline, by_variant, runs, benches, scope.preset, bench_args, top)
    found = findings.findings(tests, baseline, runs, verdicts, deep_table)
    plan = plans.make(tests, runs, scope, baseline, max_seeds, db, kinds)
    return Analysis(main, table, deep_choice, deep_table, tests, verdicts, found, plan, by_variant)
