"""Commands around the runs: benchmarks, export/import, spool sync, schema upgrade, data preparation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from attnres.errors import AttnresError
from cli.app import DbOpt, ExperimentOpt, PresetOpt, app, console, data_app, db_app, err


@app.command("export")
def export_cmd(
    fmt: Annotated[str, typer.Option("--format", help="csv or parquet")] = "csv",
    out: Annotated[Path, typer.Option("--out", help="folder to write runs.* and metrics.*")] = Path("export"),
    experiment: ExperimentOpt = None,
    preset: PresetOpt = None,
    db: DbOpt = None,
) -> None:
    """Export runs and their metrics (all, or one experiment's or preset's) to CSV or Parquet."""
    from attnres.tracking.db import get_engine
    from attnres.tracking.transfer import export

    for path in export(get_engine(db, create=False), out, fmt, experiment, preset):
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="CSV/JSONL/Parquet: run?, variant, seed, step, key, value, status?")],
    db: DbOpt = None,
) -> None:
    """Import runs recorded elsewhere (format: see attnres/tracking/transfer.py or README) into the database."""
    from attnres.tracking.db import get_engine
    from attnres.tracking.transfer import import_file, imported_text, read_import

    frame = read_import(file)  # checked before the database is opened: bad input changes nothing
    counts = import_file(get_engine(db), file, frame)
    console.print(imported_text(counts), markup=False, highlight=False, soft_wrap=True)


@app.command()
def bench(
    target: Annotated[list[str] | None, typer.Argument(
        help="variants to race against standard (default: every variant with a target), or data | report | "
             "tracker | errors")] = None,
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
    repeat: Annotated[int | None, typer.Option(
        min=1, help="bench tracker: tries per measure, the best kept (default: ingest 5, report 2, "
                    "processes 3)")] = None,
    draws: Annotated[int, typer.Option(min=1, help="bench errors: synthetic databases per design")] = 200,
    variants: Annotated[int, typer.Option(min=1, max=11, help="bench errors: variants against the baseline")] = 9,
    seeds: Annotated[int, typer.Option("--seeds", min=2, help="bench errors: seeds per variant")] = 3,
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
    if kind in {"data", "report", "tracker", "errors"}:
        if kind == "errors":
            from rich.progress import Progress, TextColumn, TimeElapsedColumn

            from reports.bench import bench_errors

            with Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=err, disable=json_out,
                          transient=True) as bar:
                task = bar.add_task("errors")
                result = bench_errors(draws, variants, seeds, progress=lambda msg: bar.update(task, description=msg),
                                      processes=processes)
        elif kind == "data":
            from attnres.bench.data import bench_data

            result = bench_data(megabytes)
        elif kind == "report":
            from reports.bench import bench_report

            result = bench_report(200 if runs is None else runs, 6000 if steps is None else steps)
        else:
            from rich.progress import Progress, TextColumn, TimeElapsedColumn  # (not on status's path)

            from attnres.bench.tracker import bench_tracker
            from reports.build import write_report

            with Progress(TextColumn("{task.description}"), TimeElapsedColumn(), console=err, disable=json_out,
                          transient=True) as bar:
                task = bar.add_task("tracker")
                result = bench_tracker(write_report, rows, 40 if runs is None else runs,
                                       3000 if steps is None else steps, status_runs, server=server,
                                       progress=lambda msg: bar.update(task, description=msg), repeat=repeat)
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
        from attnres.tracking.db import get_engine

        session = store_session(get_engine(db), rows, preset, set_, 10 if steps is None else steps)
        err.print(f"recorded as bench {session} ({rows[0]['device_model']}, {rows[0]['threads']} thread(s)): "
                  "reports take speed costs from it where the runs they compare trained under different conditions")


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


@app.command()
def inspect(
    run: Annotated[int, typer.Argument(min=1, help="run id (an AttnRes variant's)")],
    out: Annotated[Path, typer.Option("--out", help="PNG file to draw the map to")] = Path("depth_map.png"),
    step: Annotated[int | None, typer.Option(min=0, help="eval step (default: the run's last map)")] = None,
    db: DbOpt = None,
) -> None:
    """Draw one run's depth-attention map: each site's mean weight on each source, at an eval."""
    from attnres.tracking.db import get_engine
    from reports.build import inspect as draw

    at, summary = draw(get_engine(db, create=False), run, out, step)
    console.print(f"run {run} at step {at:,}: {summary}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {out}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def sync(
    spool: Annotated[list[Path] | None, typer.Argument(help="spool files (default: logs/*.spool.jsonl)")] = None,
    mirror: Annotated[list[str] | None, typer.Option("--mirror", help="then send the runs to this mirror: what it "
                                                     "does not hold yet (mlflow[=URI], trackio[=PROJECT], "
                                                     "wandb[=PROJECT]; repeatable)")] = None,
    run: Annotated[list[int] | None, typer.Option("--run", min=1, help="with --mirror: only this run "
                                                  "(repeatable; default every run)")] = None,
    db: DbOpt = None,
) -> None:
    """Write spooled metrics and run states (left when the database was unreachable) into the database;
    with --mirror, then send runs to a mirror (what a run's own mirroring missed, or runs from before)."""
    from attnres import mirrors
    from attnres.runs import orchestrator
    from attnres.tracking.db import get_engine

    targets = mirrors.specs(mirror) if mirror else []
    if run and not targets:
        raise AttnresError("--run selects the runs --mirror sends: give --mirror too")
    engine = get_engine(db)
    done = orchestrator.sync(engine, spool)
    for path, got in done:
        extra = f", {got['runs']} run(s) recreated" if got["runs"] else ""
        extra += f", {got['skipped']} unreadable line(s) skipped" if got["skipped"] else ""
        console.print(f"{path}: {got['rows']:,} metric rows{extra}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"synced {len(done)} spool file(s): {sum(g['rows'] for _, g in done):,} rows")
    if targets:
        _sync_mirrors(engine, targets, run)


def _sync_mirrors(engine: object, targets: list[str], runs: list[int] | None) -> None:
    from rich.progress import Progress

    from attnres.mirrors.sender import sync as send

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("mirroring", total=None)
        done = send(engine, targets, runs, on_run=lambda rid, spec, n: progress.update(
            task, advance=1, description=f"run {rid} -> {spec}"))
    from attnres.mirrors.sender import SKIPPED

    for rid, spec, why in done:
        if isinstance(why, str) and why.startswith(SKIPPED):
            console.print(f"run {rid} -> {spec}: {why}", markup=False, highlight=False, soft_wrap=True)
    failed = [(rid, spec, why) for rid, spec, why in done if isinstance(why, str) and not why.startswith(SKIPPED)]
    for rid, spec, why in failed:
        err.print(f"run {rid} -> {spec}: not sent: {why}", markup=False, highlight=False, soft_wrap=True)
    sent = sum(n for _, _, n in done if isinstance(n, int))
    console.print(f"mirrored {len({r for r, _, n in done if isinstance(n, int)})} run(s): {sent:,} values sent"
                  + (f"; {len(failed)} failed" if failed else ""))
    if failed:
        raise typer.Exit(1)


@app.command("mirror")
def mirror_default(
    spec: Annotated[list[str] | None, typer.Argument(help="mlflow[=URI], trackio[=PROJECT], wandb[=PROJECT]")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="launch without mirrors unless --mirror says")] = False,
    db: DbOpt = None,
) -> None:
    """Show or set this database's mirrors: where runs launched into it without --mirror are also sent
    (ATTNRES_MIRROR, when set, comes first)."""
    from attnres import mirrors
    from attnres.tracking import mirror_marks
    from attnres.tracking.db import get_engine

    if spec and clear:
        raise AttnresError("give mirrors to set, or --clear, not both")
    engine = get_engine(db)
    if spec or clear:
        mirror_marks.set_default_mirrors(engine, mirrors.specs(spec) if spec else None)
    now = mirror_marks.default_mirrors(engine)
    console.print(f"mirrors of this database: {' '.join(now) if now else 'none'}", markup=False, highlight=False)


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Migrate the database to this attnres's schema in place (Alembic), keeping every run: all or nothing
    (one transaction), and a SQLite file is first copied beside it (<file>.before-upgrade-<rev>-<time>, kept)."""
    from attnres.tracking.upgrade import upgrade

    before, after = upgrade(db, say=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    console.print(f"database schema: {before or 'empty'} -> {after}")


@data_app.command("prepare")
def data_prepare(
    source: Annotated[str, typer.Option(help="builtin | files | fineweb-edu")] = "builtin",
    data_files: Annotated[list[str] | None, typer.Option("--data-files", help="parquet/jsonl files or globs")] = None,
    out: Annotated[Path | None, typer.Option(help="dataset folder (default data/<source>)")] = None,
    max_tokens: Annotated[int, typer.Option(help="stop after this many tokens (0 = all)")] = 0,
    config: Annotated[str, typer.Option(help="FineWeb-Edu config")] = "sample-10BT",
    eval_fraction: Annotated[float, typer.Option(help="share of documents held out")] = 0.1,
    shard_tokens: Annotated[int, typer.Option(min=1, help="tokens per shard")] = 50_000_000,
    force: Annotated[bool, typer.Option(help="discard an existing dataset at --out")] = False,
    workers: Annotated[int | None, typer.Option(min=1, max=1024, help="processes encoding batches (default: "
                                                "one per core; 1: threads in this process)")] = None,
    tokenizer: Annotated[str, typer.Option(help="gpt2 (GPT-2 BPE) | bytes (UTF-8 bytes, 257 ids: quick CPU "
                                           "runs with --set vocab_size=320; default out data/<source>-bytes)")]
    = "gpt2",
) -> None:
    """Tokenize a corpus (GPT-2 BPE, or bytes) into uint16 shards with a held-out split and a manifest."""
    from attnres.data.prepare import prepare, source_for

    src, target = source_for(source, data_files, config, max_tokens, eval_fraction, out, tokenizer)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # (not on status's path)

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[rate]}"),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("tokenizing", total=max_tokens or None, rate="")
        import time

        started = time.perf_counter()  # (the rate over the whole tokenizing, not since its first report)

        def on_progress(docs: int, tokens: int) -> None:
            rate = tokens / max(1e-3, time.perf_counter() - started)
            bar.update(task, completed=tokens, rate=f"{docs:,} docs, {tokens:,} tok, {rate:,.0f} tok/s")

        summary = prepare(src, target, shard_tokens=shard_tokens, force=force, on_progress=on_progress,
                          workers=workers or max(1, os.cpu_count() or 1))
    if summary.skipped:
        console.print(f"{target}: already prepared ({summary.tokens['train']:,} train + "
                      f"{summary.tokens['eval']:,} eval tokens); nothing to do", markup=False, highlight=False)
    else:
        console.print(f"{target}: {summary.documents:,} documents, {summary.tokens['train']:,} train + "
                      f"{summary.tokens['eval']:,} eval tokens in {summary.seconds:.1f} s", markup=False,
                      highlight=False)
