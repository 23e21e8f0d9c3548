"""`attnres bench`: what AttnRes costs against standard, the tracker, data preparation, the scaling checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from attnres.cli.app import DbOpt, app, console, err


@app.command()
def bench(
    target: Annotated[list[str] | None, typer.Argument(
        help="variants to race against standard (default: every variant with a target), or data | report | "
             "tracker | errors | scaling")] = None,
    preset: Annotated[str, typer.Option(help="variants: model size (default `bench`: 12L d512, vocab 512)")] = "bench",
    steps: Annotated[int | None, typer.Option(
        help="variants: timed steps (10); report: steps per run (6000; tracker: 3000)")] = None,
    warmup: Annotated[int, typer.Option(min=0, help="variants: untimed steps first")] = 1,
    set_: Annotated[list[str] | None, typer.Option("--set", help="variants: override KEY=VALUE")] = None,
    device: Annotated[str | None, typer.Option(help="variants: cpu | cuda (default: cuda if present)")] = None,
    megabytes: Annotated[float, typer.Option(help="bench data: text size")] = 8.0,
    runs: Annotated[int | None, typer.Option(help="bench report: runs (200; tracker: 40)")] = None,
    rows: Annotated[int, typer.Option(min=1, help="bench tracker: metric rows to ingest")] = 100_000,
    status_runs: Annotated[int, typer.Option(min=1, help="bench tracker: runs `attnres status` lists from")] = 1000,
    server: Annotated[str | None, typer.Option(help="bench tracker: also ingest into this PostgreSQL URL")] = None,
    grow: Annotated[int, typer.Option(min=1, help="bench tracker: the report and status again at this many times "
                                      "the runs, with the growth of their times (1: one size)")] = 10,
    paper: Annotated[bool, typer.Option("--paper/--no-paper", help="bench tracker: the report and status over the "
                                        "results document's study at paper scale (15 variants x 5 seeds x 6,000 "
                                        "steps; with --server also there)")] = True,
    paper_steps: Annotated[int, typer.Option(min=250, help="bench tracker: steps of each run at paper scale")] = 6000,
    repeat: Annotated[int | None, typer.Option(
        min=1, help="bench tracker: tries per measure, the best kept (default: ingest 5, report 2, "
                    "processes 3)")] = None,
    draws: Annotated[int | None, typer.Option(min=1, help="bench errors: synthetic databases per design (200); "
                                              "bench scaling: synthetic ladders per kind (100)")] = None,
    variants: Annotated[int, typer.Option(min=1, max=11, help="bench errors: variants against the baseline")] = 9,
    seeds: Annotated[list[int] | None, typer.Option("--seeds", min=2, help="bench errors: seeds per variant in the "
                                                    "family-wise design (repeatable; default 3 and 5)")] = None,
    design: Annotated[list[str] | None, typer.Option("--design", help="bench errors: family-wise | sequential | "
                                                     "power (repeatable; default all three)")] = None,
    effect: Annotated[list[float] | None, typer.Option("--effect", min=0.01, help="bench errors --design power: "
                                                       "true effect sizes d (default 0.5 0.67 1 1.33 2)")] = None,
    processes: Annotated[bool, typer.Option("--processes", help="bench errors: run `attnres import` and `attnres "
                                            "report` as processes (slower), not in this one")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    record: Annotated[bool, typer.Option("--record/--no-record", help="variants: keep the result in the database, "
                                         "where reports take speed costs from it")] = True,
    db: DbOpt = None,
) -> None:
    """Benchmarks measured side by side in one process: variants vs standard, data preparation, reports."""
    import json

    kind = target[0] if target else "variants"
    if kind in {"data", "report", "tracker", "errors", "scaling"}:
        if kind == "scaling":
            from attnres.reports.bench_scaling import bench_scaling

            result = _with_progress(kind, json_out, lambda say: bench_scaling(100 if draws is None else draws,
                                                                              progress=say))
        elif kind == "errors":
            from attnres.reports.bench import bench_errors

            result = _with_progress(kind, json_out, lambda say: bench_errors(
                200 if draws is None else draws, variants, tuple(seeds or ()), progress=say, processes=processes,
                designs=tuple(design or ()), effects=tuple(effect or ())))
        elif kind == "data":
            from attnres.bench.data import bench_data

            result = bench_data(megabytes)
        elif kind == "report":
            from attnres.reports.bench import bench_report

            result = bench_report(200 if runs is None else runs, 6000 if steps is None else steps)
        else:
            from rich.progress import Progress, TextColumn, TimeElapsedColumn  # (not on status's path)

            from attnres.bench.tracker import bench_tracker
            from attnres.reports.build import write_report

            with Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=err, disable=json_out,
                          transient=True) as bar:
                task = bar.add_task("tracker")
                result = bench_tracker(write_report, rows, 40 if runs is None else runs,
                                       3000 if steps is None else steps, status_runs, server=server,
                                       progress=lambda msg: bar.update(task, description=msg), repeat=repeat,
                                       grow=grow, paper=paper, paper_steps=paper_steps)
        if json_out:
            console.print_json(json.dumps(result))
            return
        table = Table(title=f"attnres bench {kind}")
        table.add_column("measure")
        table.add_column("value", justify="right")
        for k, v in result.items():
            table.add_row(Text(k), f"{v:,.3f}" if isinstance(v, float) else f"{v:,}")
        console.print(table)
        return
    from attnres.bench.variant_speed import TARGETS, bench_models, store_session

    names = list(target or TARGETS)
    from rich.progress import Progress, TextColumn, TimeElapsedColumn  # (not on status's path)

    with Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  disable=json_out, transient=True) as bar:
        task = bar.add_task("building models")
        rows = bench_models(names, preset, 10 if steps is None else steps, warmup, set_, device,
                            progress=lambda msg: bar.update(task, description=msg))
    if json_out:
        console.print_json(json.dumps(rows))
    else:
        _bench_table(rows, preset, 10 if steps is None else steps)
    if record:  # after the figures are out: a database that cannot take them loses no measurement
        from attnres.tracking.run_store import RunStore

        session = store_session(RunStore(db), rows, preset, set_, 10 if steps is None else steps)
        err.print(f"recorded as bench {session} ({rows[0]['device_model']}, {rows[0]['threads']} thread(s)): "
                  "reports take speed costs from it where the runs they compare trained under different conditions")


def _with_progress(name: str, quiet: bool, work: Callable[[Callable[[str], None]], dict[str, float]]
                   ) -> dict[str, float]:
    """``work`` given a callback that shows its progress on stderr under ``name`` (nothing with ``quiet``)."""
    from rich.progress import Progress, TextColumn, TimeElapsedColumn  # (not on status's path)

    with Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=err, disable=quiet,
                  transient=True) as bar:
        task = bar.add_task(name)
        return work(lambda msg: bar.update(task, description=msg))


def _bench_table(rows: list[dict[str, object]], preset: str, steps: int) -> None:
    r0 = rows[0]
    table = Table(title=Text(f"attnres bench at {preset}: {r0['device']}, {r0['tokens_per_step']:,} tokens/step, "
                             f"median of {steps} paired steps, depth attention: {r0['depth_kernel']}"))
    for col in ["variant", "shape", "tokens/s", "vs standard", "IQR", "peak step memory", "saved B/token",
                "vs standard ", "meets"]:
        table.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
    for r in rows:
        peak = "n/a (CPU)" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f} GiB"
        spread = f"{r['speed_ratio_q1']:.2f}-{r['speed_ratio_q3']:.2f}"
        speed = f"{r['speed_ratio']:.3f}" + (f" (≥{r['speed_target']})" if r["speed_target"] else "")
        saved = f"{r['saved_ratio']:.3f}" + (f" (≤{r['saved_target']})" if r["saved_target"] else "")
        meets = {None: "", True: "yes", False: "NO"}[r["meets_targets"]]
        table.add_row(Text(str(r["variant"])), f"{r['n_layer']}L d{r['d_model']}", f"{r['tokens_per_s']:,.0f}", speed,
                      spread, peak, f"{r['saved_bytes_per_token']:,.0f}", saved, meets)
    console.print(table)
