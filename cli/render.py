"""What the commands that start runs print: each planned cell, a Ctrl-C, what a submission did."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import typer
from rich.table import Table
from rich.text import Text

from attnres.cli.app import console, err
from attnres.cli.bars import RunBars

if TYPE_CHECKING:
    from attnres.runs.backends import Submitted
    from attnres.runs.planning import PlannedRun
    from attnres.tracking.run_store import RunStore


def show_cell(c: PlannedRun) -> None:
    """One planned cell: variant, swept values, seed, preset and steps, the experiment and data it is recorded
    under, the other ``--set`` values it trains with, and whether it runs, resumes or is skipped (and why).

    Everything that tells two runs apart is on the line, so a dry run shows what a launch would record (a
    mistyped --experiment or a forgotten --data is seen before anything trains)."""
    from rich.text import Text

    line = Text(c.cfg.variant)
    for k, v in c.cell.items():  # the swept values name the cell: right after the variant, bold on a terminal
        if k == "steps":  # (a ladder's size sets its steps: they have their own place below)
            continue
        line.append(" ").append(f"{k}={v}", "bold")
    line.append(f" seed={c.cfg.seed} preset={c.cfg.preset} steps={c.cfg.train.steps} "
                f"experiment={c.cfg.experiment_name} data={c.cfg.data}")
    line.append("".join(f" {k}={v}" for k, v in c.settings.items() if k not in c.cell) + " — ")
    if c.skip:
        line.append("skip", "yellow").append(f": {c.skip}")
    else:
        line.append(f"resume run {c.run_id}" if c.run_id else "run", "cyan" if c.run_id else "green")
    console.print(line, soft_wrap=True)  # one line however many settings: not folded at the console's width


def stopped(stop: Exception) -> None:
    """Ctrl-C: the one line that says what stopped and how to continue; exit 130."""
    err.print(str(stop), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(130)


def show_submitted(store: RunStore, done: Submitted) -> None:
    """Print what a submission did; exit 1 when a run it waited for did not finish."""
    from rich.text import Text

    from attnres import paths
    from attnres.tracking import states

    for line in done.lines:  # (they name paths, jobs and hosts: data, never markup)
        console.print(line, markup=False, highlight=False)
    results = done.results or {}
    for run_id, status in results.items():
        color = "green" if status == states.FINISHED else "red"
        log = store.run(run_id).log_path or paths.run_log(run_id)
        console.print(Text(f"run {run_id}: ").append(status, color).append(f" (log: {log})"))
    if any(s != states.FINISHED for s in results.values()):
        raise typer.Exit(1)


def submit(store: RunStore, start: Callable[[RunBars], Submitted]) -> None:
    """Start runs with ``start`` (given the progress bars to feed), then say what it did: the one place the
    verbs that start runs (launch, resume, next --launch) handle their bars and a Ctrl-C (one line, exit 130)."""
    from attnres.runs.backends import QueueStopped

    bars = RunBars(store)
    try:
        done = start(bars)
    except QueueStopped as stop:
        bars.close()
        stopped(stop)
    finally:
        bars.close()
    show_submitted(store, done)


def print_frame(df: object, title: str, floatfmt: str = "") -> None:
    """A DataFrame as a rich table; its cells are data, never markup. A table that carries its numbers' formats
    (compare's: :func:`reports.numbers.formats`) is written by them, as its markdown is (``floatfmt`` unused)."""
    import pandas as pd

    assert isinstance(df, pd.DataFrame)
    align = ["right" if pd.api.types.is_numeric_dtype(df[col]) else "left" for col in df.columns]
    if "formats" in df.attrs:
        from attnres.reports.numbers import as_text

        df = as_text(df)
    table = Table(title=title)
    for col, justify in zip(df.columns, align, strict=True):
        table.add_column(str(col), justify=justify)
    for row in df.itertuples(index=False):
        table.add_row(*[Text(format(v, floatfmt) if floatfmt and isinstance(v, float) else str(v)) for v in row])
    console.print(table)
