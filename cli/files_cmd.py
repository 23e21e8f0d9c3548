"""Data in and out: `export` and `import` of runs, `data prepare` of a tokenized corpus."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from attnres.cli.app import DbOpt, ExperimentOpt, PresetOpt, app, console, data_app


@app.command("export")
def export_cmd(
    fmt: Annotated[str, typer.Option("--format", help="csv or parquet")] = "csv",
    out: Annotated[Path, typer.Option("--out", help="folder to write runs.* and metrics.*")] = Path("export"),
    experiment: ExperimentOpt = None,
    preset: PresetOpt = None,
    db: DbOpt = None,
) -> None:
    """Export runs and their metrics (all, or one experiment's or preset's) to CSV or Parquet."""
    from attnres.tracking.run_store import RunStore

    for path in RunStore(db, create=False).export(out, fmt, experiment, preset):
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="CSV/JSONL/Parquet: run?, variant, seed, step, key, value, status?")],
    db: DbOpt = None,
) -> None:
    """Import runs recorded elsewhere (format: see attnres/tracking/transfer.py or docs/cli.md) into the database."""
    from attnres.tracking import imported_text, read_import
    from attnres.tracking.run_store import RunStore

    frame = read_import(file)  # checked before the database is opened: bad input changes nothing
    counts = RunStore(db).import_file(file, frame)
    console.print(imported_text(counts), markup=False, highlight=False, soft_wrap=True)


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
