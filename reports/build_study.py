"""Where ``attnres next`` and ``attnres study`` meet the database: the analysis a plan is part of, and a study's
outlook of its scope (what :func:`attnres.runs.study.drive` asks its planner before each stage).

The library never imports the report package, so a study's driver is given its planner from here: a function that
reads the scope's runs again and returns the plan, and how many of its comparisons are resolved, as an
:class:`attnres.runs.study.Outlook` (:func:`reports.studies.outlook`, pure).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import pandas as pd

from attnres.errors import AttnresError
from attnres.reports import studies
from attnres.reports.analysis import Analysis, analyse
from attnres.reports.build import _scoped, db_args, launch_plans
from attnres.reports.next_plan import KINDS, MAX_SEEDS
from attnres.reports.scope import LATEST, Asked
from attnres.reports.stats import ReportError
from attnres.runs.study import Outlook
from attnres.tracking.run_store import RunStore
from attnres.variants import traits


def next_analysis(store: RunStore, asked: Asked = LATEST, max_seeds: int = MAX_SEEDS,
                  kinds: tuple[str, ...] = KINDS) -> tuple[pd.DataFrame, Analysis]:
    """One scope's runs and their analysis as its document gives it, for the plan's parts ``kinds``: its plan is
    what ``attnres next`` prints and launches, its tests what a study counts resolved."""
    runs, scope, _ = _scoped(store.run_table(), replace(asked, tuned=None))
    res, baseline = store.load_results(runs=runs), asked.baseline
    if baseline not in set(res.runs["variant"]):
        raise AttnresError(f"no runs of the baseline '{baseline}' in {scope.label()}; run it or pass --baseline")
    try:
        return res.runs, analyse(res.runs, res.evals, scope, baseline, traits.deep_variants(), None,
                                 launch_plans(store.launches_frame()), max_seeds, db_args(store), kinds)
    except ReportError as exc:
        raise AttnresError(f"cannot plan: {exc}") from None


def outlook(store: RunStore, asked: Asked, max_seeds: int, kinds: tuple[str, ...]) -> Outlook:
    """The outlook of a scope now (the scope chosen as ``attnres next`` chooses it): a new study's first look,
    which also checks the scope and the baseline before anything is recorded."""
    runs, analysis = next_analysis(store, asked, max_seeds, kinds)
    return studies.outlook(analysis, runs, kinds, max_seeds, asked.pick)


def planner(store: RunStore, scope: Mapping[str, object]) -> Callable[[], Outlook]:
    """A recorded study's planner: the outlook of the scope it pinned (``studies.scope_json``), made anew each time."""
    def plan() -> Outlook:
        asked = Asked(str(scope["baseline"]), str(scope["experiment"]), str(scope["preset"]), int(scope["budget"]),
                      str(scope["data"]), dict(scope["pick"]))
        return outlook(store, asked, int(scope["max_seeds"]), tuple(scope["parts"]))

    return plan
