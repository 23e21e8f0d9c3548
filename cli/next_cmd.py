"""``attnres next``: print the plan that resolves a scope's open questions, and with ``--launch`` start it."""

from __future__ import annotations

import shlex
from typing import Annotated

import typer
from rich.text import Text

from attnres.cli.app import BudgetOpt, CellOpt, DataOpt, DbOpt, ExperimentOpt, PresetOpt, app, console
from attnres.cli.render import show_cell, submit
from attnres.runs import DEFAULT_BACKEND


@app.command("next")
def next_cmd(
    launch: Annotated[bool, typer.Option("--launch", help="launch the plan's runs (one stage; the planned seeds per "
                                         "comparison are recorded, and the report tests them as planned)")] = False,
    only: Annotated[list[str] | None, typer.Option("--only", help="only these parts: resolve, new, retry "
                                                   "(repeatable; default all three; without new, seed counts need "
                                                   "not allow for the never-run variants)")] = None,
    max_seeds: Annotated[int | None, typer.Option("--max-seeds", min=2, max=1000, help="seeds per arm a plan asks "
                                                  "for at most (default 10)")] = None,
    baseline: Annotated[str, typer.Option(help="variant every Δ is measured against")] = "standard",
    detach: Annotated[bool, typer.Option(help="with --launch: return at once; the queue runs in the background")
                      ] = False,
    backend: Annotated[str, typer.Option(help="with --launch: where the runs execute: local | slurm | inline (in "
                                               "this process)")] = DEFAULT_BACKEND,
    experiment: ExperimentOpt = None,
    preset: PresetOpt = None,
    budget: BudgetOpt = None,
    data: DataOpt = None,
    set_: CellOpt = None,
    db: DbOpt = None,
) -> None:
    """What's Next for one scope (default: the latest): the runs that resolve its open comparisons (seeds per
    arm from a power calculation), what is running, what was never run, retries for what failed."""
    from attnres.tracking.run_store import RunStore

    store = RunStore(db, create=False)  # no database: one line at once, before the report code is imported
    if launch:
        from attnres.runs import backends

        backends.get(backend).check_detach(detach)

    from attnres.reports import next_plan as plans
    from attnres.reports.build import next_plan
    from attnres.reports.scope import Asked
    from attnres.runs import orchestrator, planning
    from attnres.runs.grid import parse_pick
    from attnres.variants.registry import canonical

    kinds = plans.kinds(only)
    if launch:  # after a crash: its dead runs end first, so the plan retries them (a read without --launch)
        orchestrator.reconcile(store)
    asked = Asked(canonical(baseline), experiment, preset, budget, data, parse_pick(set_ or []))
    plan = next_plan(store, asked, max_seeds or plans.MAX_SEEDS, kinds)
    console.print(Text(f"What's next for {plan.scope.label()}:", style="bold"))
    shown = plan.shown(kinds)  # (--only: its parts alone, as --launch starts them)
    parts = " ".join(f"--only {k}" for k in dict.fromkeys(kinds)) if set(kinds) < set(plans.KINDS) else ""
    if not shown and parts:
        console.print(f"nothing to do for {parts}", markup=False)
    for i, item in enumerate(shown, 1):
        console.print(Text(f"{i}. {plans.TITLES[item.kind]}", style="bold"))
        for line in item.lines:
            console.print(Text(f"   - {line}"), soft_wrap=True)
        for cmd in plan.commands(item):
            console.print(Text(f"     {shlex.join(cmd)}", style="cyan"), soft_wrap=True)
    cells = plan.cells(kinds)
    if not launch:
        if cells and not plan.imported:
            console.print(f"{f'With {parts}, ' if parts else ''}`attnres next --launch` starts these {len(cells)} "
                          "run(s).")
        return
    requests = plan.requests(kinds, backend)
    if not requests:
        console.print("nothing to launch: every comparison is resolved, planned, waiting or beyond --max-seeds")
        return
    batches = [(req, planning.plan(store, req)) for req in requests]
    for _, planned in batches:
        for c in planned:
            show_cell(c)
    registration = plan.registration_of(kinds)
    submit(store, lambda bars: orchestrator.launch_plan(store, batches, registration, detach=detach,
                                                        on_queued=bars.watch)[1])
