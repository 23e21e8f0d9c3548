"""``attnres next``: print the plan that resolves a scope's open questions, and with ``--launch`` start it."""

from __future__ import annotations

import shlex
from typing import Annotated

import typer
from rich.text import Text

from attnres.errors import AttnresError
from cli.app import BudgetOpt, CellOpt, DataOpt, DbOpt, ExperimentOpt, PresetOpt, app, console
from cli.bars import RunBars


@app.command("next")
def next_cmd(
    launch: Annotated[bool, typer.Option("--launch", help="launch the plan's runs (one stage; the planned seeds per "
                                         "comparison are recorded, and the report tests them as planned)")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="with --launch, only these parts: resolve, new, "
                                                   "retry (repeatable; default all three)")] = None,
    max_seeds: Annotated[int, typer.Option("--max-seeds", min=2, max=1000, help="seeds per arm a plan asks for at "
                                           "most")] = 10,
    baseline: Annotated[str, typer.Option(help="variant every Δ is measured against")] = "standard",
    detach: Annotated[bool, typer.Option(help="with --launch: return at once; the queue runs in the background")
                      ] = False,
    experiment: ExperimentOpt = None,
    preset: PresetOpt = None,
    budget: BudgetOpt = None,
    data: DataOpt = None,
    set_: CellOpt = None,
    db: DbOpt = None,
) -> None:
    """What's Next for one scope (default: the latest): the runs that resolve its open comparisons (seeds per
    arm from a power calculation), what is running, what was never run, retries for what failed."""
    from attnres import orchestrator, planning
    from attnres.backends import QueueStopped
    from attnres.grid import parse_pick
    from attnres.tracking.db import get_engine, normalize_url
    from attnres.variants import canonical
    from cli.main import _show_submitted, _stopped, show_cell
    from reports.build import next_plan
    from reports.plan import KINDS, TITLES

    kinds = tuple(only or KINDS)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise AttnresError(f"--only {bad[0]}: choose from {', '.join(KINDS)}")
    engine = get_engine(db, create=False)
    plan = next_plan(engine, canonical(baseline), experiment, preset, budget, data, parse_pick(set_ or []), max_seeds)
    console.print(Text(f"What's next for {plan.scope.label()}:", style="bold"))
    for i, item in enumerate(plan.items, 1):
        console.print(Text(f"{i}. {TITLES[item.kind]}", style="bold"))
        for line in item.lines:
            console.print(Text(f"   - {line}"), soft_wrap=True)
        for cmd in [shlex.join(x.argv(plan.scope)) for x in item.launches] + [shlex.join(c) for c in item.commands]:
            console.print(Text(f"     {cmd}", style="cyan"), soft_wrap=True)
    todo = plan.launches(kinds)
    if not launch:
        if todo:
            console.print(f"`attnres next --launch` starts these {len(plan.cells(kinds))} run(s).")
        return
    if not todo:
        console.print("nothing to launch: every comparison is resolved, planned, waiting or beyond --max-seeds")
        return
    batches = []
    for x in todo:
        req = planning.request(x.variants, x.seeds, plan.scope.preset, plan.scope.budget, x.overrides,
                               plan.scope.data, experiment=plan.scope.experiment)
        batches.append((req, planning.plan(engine, req)))
    for _, cells in batches:
        for c in cells:
            show_cell(c)
    registration = {"comparisons": [p for p in plan.registration if p["kind"] in kinds]}
    bars = RunBars(engine)
    try:
        _, done = orchestrator.launch_plan(engine, normalize_url(db), batches, registration, detach=detach,
                                           on_queued=bars.watch)
    except QueueStopped as stop:
        bars.close()
        _stopped(stop)
    finally:
        bars.close()
    _show_submitted(engine, done)
