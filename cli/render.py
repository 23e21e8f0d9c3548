"""What the commands that start runs print: each planned cell, a Ctrl-C, what a submission did."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from cli.app import console, err
from cli.bars import RunBars

if TYPE_CHECKING:
    from attnres.backends import Submitted
    from attnres.planning import PlannedRun


def show_cell(c: PlannedRun) -> None:
    """One planned cell: variant, swept values, seed, and whether it runs, resumes or is skipped (and why)."""
    from rich.text import Text

    cell = "".join(f" {k}={v}" for k, v in c.cell.items())
    line = Text(f"{c.cfg.variant}{cell} seed={c.cfg.seed} preset={c.cfg.preset} steps={c.cfg.train.steps} ")
    if c.skip:
        line.append("skip", "yellow").append(f": {c.skip}")
    else:
        line.append(f"resume run {c.run_id}" if c.run_id else "run", "cyan" if c.run_id else "green")
    console.print(line)


def stopped(stop: Exception) -> None:
    """Ctrl-C: the one line that says what stopped and how to continue; exit 130."""
    err.print(str(stop), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(130)


def show_submitted(engine: object, done: Submitted) -> None:
    """Print what a submission did; exit 1 when a run it waited for did not finish."""
    from attnres import paths
    from attnres.tracking import states, store

    for line in done.lines:
        console.print(line)
    results = done.results or {}
    for run_id, status in results.items():
        color = "green" if status == states.FINISHED else "red"
        log = store.get_run(engine, run_id).log_path or paths.run_log(run_id)
        console.print(f"run {run_id}: [{color}]{status}[/] (log: {log})")
    if any(s != states.FINISHED for s in results.values()):
        raise typer.Exit(1)


def submit(engine: object, start: Callable[[RunBars], Submitted]) -> None:
    """Start runs with ``start`` (given the progress bars to feed), then say what it did: the one place the
    verbs that start runs (launch, resume, next --launch) handle their bars and a Ctrl-C (one line, exit 130)."""
    from attnres.backends import QueueStopped

    bars = RunBars(engine)
    try:
        done = start(bars)
    except QueueStopped as stop:
        bars.close()
        stopped(stop)
    finally:
        bars.close()
    show_submitted(engine, done)
