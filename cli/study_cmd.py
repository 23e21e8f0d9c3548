"""``attnres study``: stages of ``attnres next --launch`` until the comparisons are resolved, a budget is spent, or
more seeds would not help (the driver: :mod:`attnres.runs.study`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from attnres.cli.app import RUN_ID_MAX, BudgetOpt, CellOpt, DataOpt, DbOpt, ExperimentOpt, PresetOpt, app, console, err
from attnres.cli.render import show_cell
from attnres.errors import AttnresError

if TYPE_CHECKING:
    from rich.status import Status

    from attnres.runs.planning import LaunchRequest, PlannedRun
    from attnres.runs.study import Progress


def _hours(value: float | None) -> float | None:
    from attnres.runs.study_limits import hours

    return hours(value)


def _deadline(text: str | None) -> str | None:
    """Checked at parse time (one line for one that does not parse or has passed); kept as typed, which is part of
    "the same command" a rerun continues."""
    from attnres.runs.study_limits import deadline

    deadline(text)
    return text


class StudyView:
    """A study's progress on stderr: one live line on a terminal (stage, runs done of the stage's, comparisons
    resolved, spend); elsewhere (a pipe, a detached study's log) a plain line each time the stage or a count
    changes. Each stage's runs are printed as `attnres next --launch` prints them."""

    def __init__(self) -> None:
        self.live: Status | None = None
        self.last: tuple | None = None

    def stage(self, number: int, batches: Sequence[tuple[LaunchRequest, Sequence[PlannedRun]]]) -> None:
        self.pause()
        console.print(Text(f"stage {number}:", style="bold"))
        for _, cells in batches:
            for c in cells:
                show_cell(c)

    def progress(self, now: Progress) -> None:
        parts = (f"study {now.study}", f"stage {now.stage}" if now.stage else "no stage yet",
                 f"runs {now.done}/{now.total}" if now.total else "planning",
                 f"comparisons resolved {now.resolved}/{now.compared}" if now.compared is not None else "",
                 f"spent {now.runs} run(s), {now.hours:.3g} device-hours")
        text = " · ".join(p for p in parts if p)
        if err.is_terminal:
            if self.live is None:
                self.live = err.status(text)
                self.live.start()
            self.live.update(text)
        elif (key := (now.stage, now.done, now.total, now.resolved, now.compared, now.runs)) != self.last:
            self.last = key
            err.print(text, markup=False, highlight=False, soft_wrap=True)

    def say(self, line: str) -> None:
        self.pause()
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    def pause(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


@app.command("study")
def study_cmd(
    only: Annotated[list[str] | None, typer.Option("--only", help="the parts of the plan it launches: resolve, new "
                                                   "(repeatable; default both)")] = None,
    max_seeds: Annotated[int | None, typer.Option("--max-seeds", min=2, max=1000, help="seeds per arm a plan asks "
                                                  "for at most (default 10): beyond it, the study stops")] = None,
    baseline: Annotated[str | None, typer.Option(help="variant every Δ is measured against (default standard)")
                        ] = None,
    max_runs: Annotated[int | None, typer.Option("--max-runs", min=1, help="runs its stages may hold; a stage that "
                                                 "does not fit is not launched")] = None,
    max_hours: Annotated[float | None, typer.Option("--max-hours", callback=_hours, help="device-hours it may spend "
                                                    "(each run's wall time x its ranks); no stage starts past it")
                         ] = None,
    deadline: Annotated[str | None, typer.Option("--deadline", callback=_deadline, help="no stage starts after it: an "
                                                 "ISO time (2026-12-06T18:00) or a duration (90m, 2h)")] = None,
    max_stages: Annotated[int | None, typer.Option("--max-stages", min=1, help="stages it may launch")] = None,
    detach: Annotated[bool, typer.Option(help="return at once; a background process drives the study")] = False,
    resume: Annotated[int | None, typer.Option("--resume", min=1, max=RUN_ID_MAX, metavar="ID", help="continue this "
                                               "study (limits given replace its own)")] = None,
    experiment: ExperimentOpt = None,
    preset: PresetOpt = None,
    budget: BudgetOpt = None,
    data: DataOpt = None,
    set_: CellOpt = None,
    db: DbOpt = None,
) -> None:
    """Run stages of What's Next (each as `attnres next --launch` starts it, pre-registered) until every
    comparison is resolved, a limit is reached, or more seeds would not help. Interrupted, it continues with
    `attnres study --resume ID` or the same command."""
    from attnres.tracking.run_store import RunStore

    store = RunStore(db, create=False)  # no database: one line at once, and none made

    from attnres.reports import build_study, studies
    from attnres.reports.next_plan import MAX_SEEDS
    from attnres.reports.scope import Asked
    from attnres.runs import study
    from attnres.runs.grid import parse_pick
    from attnres.runs.study_limits import Limits
    from attnres.runs.study_limits import deadline as when
    from attnres.variants.registry import canonical

    limits = Limits(max_runs, max_hours, when(deadline), max_stages)
    scope_given = [o for o, v in (("--only", only), ("--max-seeds", max_seeds), ("--baseline", baseline),
                                  ("--experiment", experiment), ("--preset", preset), ("--budget", budget),
                                  ("--data", data), ("--set", set_)) if v]
    if resume is not None and scope_given:
        raise AttnresError(f"--resume continues study {resume} in the scope it recorded: {scope_given[0]} cannot "
                           "change it (give limits only: --max-runs, --max-hours, --deadline, --max-stages)")
    if resume is not None:
        record, again = study.reopen(store, resume, limits), True
    else:
        kinds, seeds, base = studies.parts(only), max_seeds or MAX_SEEDS, canonical(baseline or "standard")
        first = build_study.outlook(store, Asked(base, experiment, preset, budget, data, parse_pick(set_ or [])),
                                    seeds, kinds)
        given = {"max_runs": max_runs, "max_hours": max_hours, "deadline": deadline, "max_stages": max_stages}
        record, again = study.begin(store, first, {"baseline": base, "parts": list(kinds), "max_seeds": seeds},
                                    limits, given)
    console.print(f"study {record.id}{' (continued)' if again else ''}: {record.label}; "
                  f"{Limits.from_dict(record.limits).text()}", markup=False, highlight=False, soft_wrap=True)
    if detach:
        from attnres import paths

        pid = study.detach(store, record, [sys.executable, "-m", "attnres.cli.main", "study"])
        console.print(f"study {record.id} runs in the background (pid {pid}; output in {paths.study_log(record.id)}); "
                      f"follow it with `attnres status --watch`; `kill {pid}` stops it, `attnres study --resume "
                      f"{record.id}` continues it", markup=False, highlight=False, soft_wrap=True)
        return
    view = StudyView()
    try:
        ended = study.drive(store, record.id, build_study.planner(store, record.scope), view)
    except study.StudyStopped as stop:
        view.pause()
        err.print(str(stop), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        view.pause()
    console.print(f"study {ended.study} ended, {ended.message}; spent: {ended.stages} stage(s), {ended.runs} run(s), "
                  f"{ended.hours:.3g} device-hours", markup=False, highlight=False, soft_wrap=True)
    if ended.reason == study.FAILED:
        raise typer.Exit(1)
