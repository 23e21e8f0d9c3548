"""The `scale` verb: launch a compute ladder (model sizes × token rule), every cell an ordinary run."""

from __future__ import annotations

from typing import Annotated

import typer

from attnres.cli.app import DbOpt, SeedsOpt, app
from attnres.runs import DEFAULT_BACKEND


def parse_sizes(values: list[str] | None) -> list[str] | None:
    """``--sizes`` checked at parse time (one line for a malformed size); the values pass on as given."""
    if values is None:
        return None
    from attnres.runs.ladder import parse_sizes as check

    check(values)
    return values


@app.command()
def scale(
    variant: Annotated[list[str], typer.Argument(help="variant names (see `attnres variants`); include the baseline")],
    sizes: Annotated[list[str], typer.Option("--sizes", parser=str, callback=parse_sizes, metavar="WxL[xH]",
                                             help="model sizes, WIDTHxLAYERS or WIDTHxLAYERSxHEADS, separated by "
                                             "spaces: --sizes 32x2 64x4 96x4 128x6 (a fit needs 4 or more; a "
                                             "multiplier past the ladder, 5)")],
    tokens: Annotated[str | None, typer.Option("--tokens", help="tokens every size trains on (2e6, 2M, 500k)")
                      ] = None,
    tokens_per_param: Annotated[float | None, typer.Option("--tokens-per-param", help="tokens per non-embedding "
                                                           "parameter of each size (Chinchilla: about 20)")] = None,
    seeds: SeedsOpt = None,
    preset: Annotated[str, typer.Option(help="the other settings of every size (data, context, batch, lr)")
                      ] = "tiny",
    experiment: Annotated[str | None, typer.Option(help="experiment the runs belong to (default: PRESET-scale)")
                          ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override KEY=VALUE at every size (repeatable); "
                                                   "KEY=A,B,... sweeps it")] = None,
    data: Annotated[str, typer.Option(help="prepared dataset name or folder")] = "builtin",
    nproc: Annotated[int, typer.Option(help="processes (ranks) per run on CPU")] = 1,
    detach: Annotated[bool, typer.Option(help="return at once; the queue runs in the background")] = False,
    force: Annotated[bool, typer.Option(help="run even if finished with the same config")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the ladder, the plan and the commands only")
                       ] = False,
    backend: Annotated[str, typer.Option(help="where runs execute: local | slurm | inline (in this "
                                               "process)")] = DEFAULT_BACKEND,
    backend_opt: Annotated[list[str] | None, typer.Option("--backend-opt", help="KEY=VALUE: any option of the "
                                                          "backend (its typed options)")] = None,
    mirror: Annotated[list[str] | None, typer.Option("--mirror", help="also send each run to a tracker (as "
                                                     "`launch --mirror`)")] = None,
    db: DbOpt = None,
) -> None:
    """Launch a compute ladder: every VARIANT at every size x seed, each size on the tokens of one rule.

    Every cell is an ordinary run (resumable, in `status`, mirrored); `attnres report --scaling` fits
    L(C) = E + A·C^(−α) per variant over them and gives each variant's compute-equivalent multiplier."""
    from attnres.cli.main import placement_of, start_runs
    from attnres.runs import planning
    from attnres.runs.ladder import TokenRule, parse_tokens
    from attnres.runs.ladder import parse_sizes as read_sizes

    ladder = (read_sizes(sizes), TokenRule(parse_tokens(tokens), tokens_per_param))
    req = planning.request(variant, seeds, preset, None, set_, data, backend, placement_of(backend, nproc, {},
                           backend_opt), force=force, experiment=experiment or f"{preset}-scale", mirrors=mirror,
                           ladder=ladder)
    start_runs(req, detach, dry_run, db)
