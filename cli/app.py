"""The Typer app and the consoles that every command module registers on and prints to."""

from __future__ import annotations

import os
import re
import sys
from typing import Annotated

import typer
from rich.console import Console

from attnres.errors import AttnresError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Launch, track and report AttnRes (attention over depth) experiments.")
data_app = typer.Typer(no_args_is_help=True, help="Prepare tokenized datasets.")
app.add_typer(data_app, name="data")
db_app = typer.Typer(no_args_is_help=True, help="Manage the tracking database.")
app.add_typer(db_app, name="db")
# Piped or captured output (logs, CI, scripts) is not folded at 80 columns: a number split over two
# lines cannot be read back. A terminal, or COLUMNS, still sets the width.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160
console = Console(width=_WIDTH)
err = Console(stderr=True, width=None if sys.stderr.isatty() or "COLUMNS" in os.environ else 160)

DbOpt = Annotated[str | None, typer.Option("--db", help="SQLAlchemy URL or SQLite file (default ./runs.db)")]
ExperimentOpt = Annotated[str | None, typer.Option("--experiment", help="only runs of this experiment")]
PresetOpt = Annotated[str | None, typer.Option("--preset", help="only runs of this preset")]
BudgetOpt = Annotated[int | None, typer.Option("--budget", min=1, help="only runs of this many training steps")]
DataOpt = Annotated[str | None, typer.Option("--data", help="only runs on this prepared dataset")]
CellOpt = Annotated[list[str] | None, typer.Option("--set", help="one cell of a sweep: KEY=VALUE (repeatable), "
                                                  "e.g. --set lr=1e-3")]
# The largest run id a database holds (SQLite's INTEGER is signed 64-bit): every run id argument or option takes
# max=RUN_ID_MAX, so a larger one is one line at parse time, never an OverflowError from the database driver.
RUN_ID_MAX = 2**63 - 1
TunedOpt = Annotated[str | None, typer.Option("--tuned", help="compare each variant at its best value of this swept "
                                              "setting (e.g. --tuned lr)")]


def parse_seeds(values: list[str] | None) -> list[int] | None:
    """``--seeds`` values as seeds, one per value (``--seeds 42 1337``).

    A comma list (``--seeds 1,2``) is how many tools take several values; it is answered with the spelling
    that works here, in one line, rather than click's "not a valid integer". A seed out of range (negative, or
    beyond what the database holds) is refused here too, at parse time, before anything is recorded."""
    if values is None:
        return None
    seeds = []
    for value in values:
        try:
            seeds.append(int(value))
        except ValueError:
            parts = [p for p in re.split(r"[,\s]+", " ".join(values)) if p]
            if "," in value and all(re.fullmatch(r"-?\d+", p) for p in parts):
                raise AttnresError(f"--seeds takes seeds separated by spaces: --seeds {' '.join(parts)}") from None
            raise AttnresError(f"bad --seeds '{value}': a seed is a whole number, e.g. --seeds 42 1337") from None
    from attnres.runs.planning import check_seeds  # (here, not at the top: only `launch` takes seeds, and imports it)

    return check_seeds(seeds, "--seeds")


# The values reach parse_seeds as given (parser=str), so a comma list is answered as a whole, not value by value.
SeedsOpt = Annotated[list[int] | None, typer.Option("--seeds", parser=str, callback=parse_seeds, metavar="SEED",
                                                    help="seeds, separated by spaces: --seeds 42 1337")]


MULTI_VALUE = {"--seeds", "--sizes"}


def expand_multi(argv: list[str]) -> list[str]:
    """Let list options take several values (``--seeds 42 1337``), as click wants ``--seeds 42 --seeds 1337``."""
    out: list[str] = []
    current = None
    for arg in argv:
        if arg in MULTI_VALUE:
            current = arg
            continue
        if current and (not arg.startswith("-") or arg[1:].isdigit()):  # (-1: a value, refused as a seed)
            out += [current, arg]
            continue
        if current and out[-2:-1] != [current]:
            out.append(current)  # a bare flag: let click report the missing value
        current = None
        out.append(arg)
    if current and out[-2:-1] != [current]:
        out.append(current)
    return out
