"""Studies in the report package: a study's outlook from one analysis (what its driver decides on), and the
document's Studies section (how each study of the scope ended, or stands, and what it spent). Pure: an analysis
or the recorded studies in, values or markdown out.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from attnres.errors import AttnresError
from attnres.reports import next_plan as plans
from attnres.reports.analysis import Analysis
from attnres.reports.escape import cell_text
from attnres.reports.evidence import BASELINE, TOP_TWO
from attnres.runs import grid
from attnres.tracking.records import ENDED, INTERRUPTED
from attnres.tracking.states import ACTIVE

if TYPE_CHECKING:
    from attnres.runs.study import Outlook


def parts(only: list[str] | None) -> tuple[str, ...]:
    """The parts of the plan a study launches (``--only``; default the resolve part and the never-run variants).
    The retry part is refused in one line: its retry is a sweep at a smaller learning rate, whose runs are other
    cells of the scope, not more seeds of the one the study resolves."""
    kinds = plans.kinds(only or [plans.RESOLVE, plans.NEW])
    if plans.RETRY in kinds:
        raise AttnresError("a study launches the resolve and new parts of the plan (--only resolve, --only new); "
                           "a retry trains other cells of the scope (a sweep of lr): start it with `attnres next "
                           "--only retry --launch`")
    return kinds


def outlook(analysis: Analysis, runs: pd.DataFrame, kinds: tuple[str, ...], max_seeds: int,
            pick: dict[str, str]) -> Outlook:
    """What a study decides on: the plan's next stage (the parts ``kinds``) and its pre-registration, and how many
    of the comparisons the plan resolves (each variant against the baseline, the top two) are resolved, wait for
    runs, or need more than ``max_seeds`` seeds per arm. The scope is pinned to its cell (``pick``, else the cell
    it found), so every stage plans in the scope the study began in."""
    from attnres.runs.study import Outlook  # (the driver: imported by a study, not by `attnres report`)

    plan = analysis.plan
    s = plan.scope
    tests = [c for c in analysis.tests if c.kind in (BASELINE, TOP_TWO)]
    still = [c for c in tests if not c.resolved]
    beyond = [c for c in still if not c.waiting and math.isinf(plans.planned_count(c, max_seeds)[0])]
    scope = {"experiment": s.experiment, "preset": s.preset, "budget": s.budget, "data": s.data,
             "pick": pick or grid.parse_pick(s.cell.split())}
    going = [int(i) for i in runs.loc[runs["status"].isin(ACTIVE), "id"]]
    return Outlook(s.label(), scope, plan.requests(kinds), plan.registration_of(kinds), len(tests),
                   len(tests) - len(still), sum(bool(c.waiting) for c in still), len(beyond), going)


def _hours(h: float) -> str:
    return f"{h:.3g} device-hours" if h >= 0.01 else f"{h * 3600:.0f} device-seconds"


def markdown(found: pd.DataFrame, label: str) -> str:
    """The Studies section: each study of the scope named ``label`` (oldest first), with how it ended (or that it
    is going, or was interrupted), its stages and what it spent; "" when no study ran here."""
    if found.empty:
        return ""
    mine = found[found["label"] == label]
    if mine.empty:
        return ""
    lines = ["## Studies\n", "`attnres study` ran stages of What's Next here until an end; each stage is a launch of "
             "the plan, with its pre-registration. Device-hours are each run's wall time times its ranks.\n"]
    for st in mine.itertuples():
        scope, limits = st.scope, st.limits
        design = (f"parts {', '.join(scope.get('parts', []))}; baseline {scope.get('baseline')}; at most "
                  f"{scope.get('max_seeds')} seeds per arm")
        given = [f"{k.replace('_', '-')} {v}" for k, v in limits.items() if v is not None]
        head = (f"- **Study {st.id}** (started {st.created_at:%Y-%m-%d %H:%M} UTC; {cell_text(design)}; limits: "
                f"{cell_text(', '.join(given) or 'none')})")
        state = {ENDED: "ended", INTERRUPTED: "interrupted"}.get(st.state, "going at its last record")
        said = f", {cell_text(st.message)}" if isinstance(st.message, str) and st.message else ""
        lines.append(f"{head}: {state}{said}. Spent: {st.stages} stage(s), {st.runs_spent} run(s), "
                     f"{_hours(float(st.hours_spent))}.")
    return "\n".join(lines) + "\n"
