"""The verbs that write documents: `report`, `compare` and `inspect` (a run's depth map)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnres import outputs
from attnres.cli.app import (
    RUN_ID_MAX,
    BudgetOpt,
    CellOpt,
    DataOpt,
    DbOpt,
    ExperimentOpt,
    PresetOpt,
    TunedOpt,
    app,
    console,
)
from attnres.cli.render import print_frame

if TYPE_CHECKING:
    pass






@app.command()
def report(
    out: Annotated[Path, typer.Option("--out", help="markdown file to write")] = Path("attnres-results.md"),
    baseline: Annotated[str, typer.Option(help="variant every Δ is measured against")] = "standard",
    step: Annotated[int | None, typer.Option(min=0, help="eval step to compare (default: the final step, or the "
                                                       "latest all compared variants reached)")] = None,
    plots: Annotated[bool, typer.Option(help="write PNG figures beside --out, in a folder named after it "
                                        "(attnres-results_figures/)")] = True,
    figures: Annotated[Path | None, typer.Option(help="folder for the PNG figures instead (linked from the "
                                                 "document by their relative path)")] = None,
    experiment: ExperimentOpt = None,
    preset: PresetOpt = None,
    budget: BudgetOpt = None,
    data: DataOpt = None,
    set_: CellOpt = None,
    tuned: TunedOpt = None,
    scaling: Annotated[bool, typer.Option("--scaling", help="write the scaling study of a ladder (`attnres scale`) "
                                          "instead: L(C) = E + A·C^(−α) per variant, compute-equivalent multipliers "
                                          "(--experiment: which ladder; default the newest)")] = False,
    db: DbOpt = None,
) -> None:
    """Write the results document of one experiment (default: the latest) from the database."""
    from attnres.tracking.run_store import RunStore

    store = RunStore(db, create=False)  # no database: one line at once, before the report code is imported
    if scaling:
        from attnres.reports.build_scaling import write_scaling
        from attnres.variants.registry import canonical

        given = {"--step": step, "--preset": preset, "--budget": budget, "--data": data, "--set": set_,
                 "--tuned": tuned}
        write_scaling(store, out, canonical(baseline), plots, experiment, figures, refused=given)
        console.print(f"wrote {out}")
        return

    from attnres.reports.build import write_report
    from attnres.reports.scope import Asked
    from attnres.runs.grid import parse_pick
    from attnres.variants.registry import canonical

    asked = Asked(canonical(baseline), experiment, preset, budget, data, parse_pick(set_ or []), tuned)
    write_report(store, out, asked, step, plots, figures=figures)
    console.print(f"wrote {out}")


@app.command()
def compare(
    variant: Annotated[list[str], typer.Argument(help="two or more arms, each a variant or a cell of one "
                                                 "(VARIANT@KEY=VALUE[,KEY=VALUE]); Δ is against the first")],
    step: Annotated[int | None, typer.Option(min=0, help="step for the seed statistics (default: last common)")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="also write the comparison as markdown")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="save Δ eval loss vs the first variant over steps (PNG)")
                    ] = None,
    experiment: ExperimentOpt = None,
    preset: PresetOpt = None,
    budget: BudgetOpt = None,
    data: DataOpt = None,
    set_: CellOpt = None,
    tuned: TunedOpt = None,
    db: DbOpt = None,
) -> None:
    """Compare variants, or settings of one (control_block@lr=1e-3 control_block@lr=3e-3), side by side: aligned
    eval losses, seed statistics, config, cost."""
    from attnres.tracking.run_store import RunStore

    store = RunStore(db, create=False)  # no database: one line at once, before the report code is imported

    from attnres.reports import side_by_side as compare_tables
    from attnres.reports.build import compare as run_compare
    from attnres.runs.grid import parse_pick

    pick = parse_pick(set_ or [])
    if out:
        outputs.check(out, example="comparison.md")
    result = run_compare(store, variant, step, plot, experiment, preset, budget, data, pick, tuned)
    console.print(result.scope.label(), markup=False, highlight=False)
    for other in result.also:
        console.print(f"also holding these variants: {other.label()} ({other.flags()})", highlight=False,
                      soft_wrap=True, markup=False)
    if result.tuning is not None:
        print_frame(result.tuning, f"Tuning of {tuned}: each variant at its best value")
    print_frame(result.aligned, "Eval loss at common steps (seed mean)", ".4f")
    print_frame(compare_tables.summary(result.stats), f"Statistics over seeds at step {result.step} vs "
                                                        f"{result.variants[0]}")
    for line in compare_tables.same_notes(result.stats):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(compare_tables.STATS_NOTE, highlight=False)
    if len(result.stats) > 1:
        print_frame(compare_tables.both_tests(result.stats), "Welch's and the paired test")
    if len(result.config):
        print_frame(result.config, "Config differences")
    print_frame(result.cost, "Throughput and memory", ",.1f")
    if out:
        outputs.write_text(out, result.markdown())
        console.print(f"wrote {out}")
    if plot:
        console.print(f"wrote {plot}")


@app.command()
def inspect(
    run: Annotated[int, typer.Argument(min=1, max=RUN_ID_MAX, help="run id (an AttnRes variant's)")],
    out: Annotated[Path, typer.Option("--out", help="PNG file to draw the map to")] = Path("depth_map.png"),
    step: Annotated[int | None, typer.Option(min=0, help="eval step (default: the run's last map)")] = None,
    db: DbOpt = None,
) -> None:
    """Draw one run's depth-attention map: each site's mean weight on each source, at an eval."""
    from attnres.reports.build import inspect as draw
    from attnres.tracking.run_store import RunStore

    at, summary = draw(RunStore(db, create=False), run, out, step)
    console.print(f"run {run} at step {at:,}: {summary}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {out}", markup=False, highlight=False, soft_wrap=True)
