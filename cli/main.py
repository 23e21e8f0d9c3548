"""The ``attnres`` command: parse arguments, call the library, render with rich. No logic here."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from attnres.errors import AttnresError
from cli.app import DbOpt, app, console, err


@app.command()
def variants(
    params: Annotated[bool, typer.Option("--params", help="count parameters at --preset")] = False,
    preset: Annotated[str, typer.Option(help="preset for --params")] = "tiny",
) -> None:
    """List every residual variant: name, description, depth sources, extra parameters."""
    from attnres.listing import PARAMS_NOTE, variant_rows
    from attnres.optim import RULE

    rows = variant_rows(preset if params else None)
    table = Table(title=f"Residual variants{f' at {preset}' if params else ''}", show_lines=not params,
                  box=box.SIMPLE_HEAD if params else box.HEAVY_HEAD, pad_edge=False)
    for col in rows[0]:
        text = col in {"variant", "description"}
        table.add_column(col, overflow="fold", justify="left" if text else "right", no_wrap=not text)
    for row in rows:
        table.add_row(*[str(v) for v in row.values()])
    console.print(table)
    if params:
        console.print(PARAMS_NOTE)
    console.print(RULE)


@app.command()
def launch(
    variant: Annotated[list[str], typer.Argument(help="variant names (see `attnres variants`)")],
    seeds: Annotated[list[int] | None, typer.Option("--seeds", help="seeds: --seeds 42 1337")] = None,
    preset: Annotated[str, typer.Option(help="model/training size")] = "tiny",
    steps: Annotated[int | None, typer.Option(help="override the preset's training steps")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override KEY=VALUE (repeatable)")] = None,
    data: Annotated[str, typer.Option(help="prepared dataset name or folder")] = "builtin",
    nproc: Annotated[int, typer.Option(help="processes (ranks) per run on CPU")] = 1,
    gpus_per_run: Annotated[int, typer.Option(help="GPUs per run (local backend)")] = 1,
    detach: Annotated[bool, typer.Option(help="return at once; the queue runs in the background")] = False,
    force: Annotated[bool, typer.Option(help="run even if finished with the same config")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan and torchrun commands only")] = False,
    kill_if_worse_than: Annotated[str | None, typer.Option(help="early-stop rule: baseline variant")] = None,
    by: Annotated[float, typer.Option(help="early-stop rule: margin in eval loss")] = 0.1,
    at_step: Annotated[int | None, typer.Option(help="early-stop rule: eval step to check")] = None,
    backend: Annotated[str, typer.Option(help="local | slurm")] = "local",
    partition: Annotated[str | None, typer.Option(help="SLURM partition")] = None,
    nodes: Annotated[int, typer.Option(help="SLURM nodes per run")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="SLURM GPUs per node (0: CPU, --nproc ranks)")] = 0,
    time_limit: Annotated[str | None, typer.Option("--time", help="SLURM time limit")] = None,
    db: DbOpt = None,
) -> None:
    """Train every VARIANT x seed with torchrun, recording runs and metrics in the database."""
    from attnres import launch as L
    from attnres import scheduler, slurm
    from attnres.tracking.db import get_engine, normalize_url
    from attnres.variants import canonical

    if nproc < 1 or gpus_per_run < 1:
        raise AttnresError("--nproc and --gpus-per-run must be at least 1")
    if backend not in {"local", "slurm"}:
        raise AttnresError(f"unknown backend '{backend}'; choose local or slurm")
    rule = None
    if kill_if_worse_than is not None:
        if at_step is None or at_step < 1:
            raise AttnresError("--kill-if-worse-than needs --at-step N (an eval step)")
        rule = {"baseline": canonical(kill_if_worse_than), "by": by, "at_step": at_step}
    opts = slurm.SlurmOptions(partition, nodes, gpus_per_node, nproc, time_limit)
    if backend == "slurm":
        opts.validate()
    overrides = list(set_ or []) + ([f"steps={steps}"] if steps is not None else [])
    engine = None if dry_run else get_engine(db)
    cells = L.plan(engine, variant, list(seeds or [42]), preset, overrides, data, force)
    for c in cells:
        state = f"[yellow]skip[/]: {c.skip}" if c.skip else ("[cyan]resume[/] run " + str(c.run_id)
                                                            if c.run_id else "[green]run[/]")
        console.print(f"{c.cfg.variant} seed={c.cfg.seed} preset={c.cfg.preset} steps={c.cfg.train.steps} {state}")
        if dry_run and not c.skip:
            cmd = L.torchrun_command(c.run_id or "{run_id}", normalize_url(db), nproc)
            console.print("  " + shlex.join(cmd), soft_wrap=True, markup=False)
    if dry_run or all(c.skip for c in cells):
        return
    for name in {c.cfg.data for c in cells if not c.skip}:
        L.check_data(name)
    ids = L.enqueue(engine, cells, nproc, rule, backend)
    if backend == "slurm":
        for rid, job in slurm.submit(engine, normalize_url(db), ids, opts).items():
            console.print(f"run {rid}: submitted as SLURM job {job}")
        return
    if detach:
        pid = scheduler.detach(db, ids, nproc, gpus_per_run)
        console.print(f"queued runs {', '.join(map(str, ids))}; queue running in the background (pid {pid}); "
                      "follow with `attnres status --watch` or `attnres logs RUN -f`")
        return
    _run_with_progress(engine, db, ids, nproc, gpus_per_run)


def _run_with_progress(engine: object, db: str | None, ids: list[int], nproc: int, gpus_per_run: int) -> None:
    from attnres import scheduler
    from attnres.launch import logs_dir
    from attnres.tracking import store

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        tasks = {}
        for rid in ids:
            run = store.get_run(engine, rid)
            tasks[rid] = bar.add_task(f"run {rid} {run.variant} s{run.seed}", total=run.total_steps)

        def tick() -> None:
            for rid, task in tasks.items():
                bar.update(task, completed=store.get_run(engine, rid).step)

        results = scheduler.run_queue(engine, db, ids, nproc, gpus_per_run, on_tick=tick)
        tick()
    for run_id, status in results.items():
        color = "green" if status == "finished" else "red"
        console.print(f"run {run_id}: [{color}]{status}[/] (log: {logs_dir() / f'run-{run_id}.log'})")
    if any(s != "finished" for s in results.values()):
        raise typer.Exit(1)


@app.command()
def resume(
    run: Annotated[list[int], typer.Argument(help="run ids to continue from their last checkpoint")],
    detach: Annotated[bool, typer.Option(help="return at once; the queue runs in the background")] = False,
    db: DbOpt = None,
) -> None:
    """Continue interrupted runs (failed, killed, preempted) from their last checkpoint."""
    import json

    from attnres import scheduler
    from attnres.config import RunConfig
    from attnres.tracking import store
    from attnres.tracking.db import get_engine
    from attnres.tracking.schema import RESUMABLE
    from attnres.variants import check_revision

    engine = get_engine(db, create=False)
    for rid in run:
        r = store.get_run(engine, rid)
        if r.status not in RESUMABLE:
            raise AttnresError(f"run {rid} is {r.status}; only {', '.join(RESUMABLE)} runs can be resumed")
        check_revision(RunConfig.from_dict(json.loads(r.config_json)), rid)
    for rid in run:
        store.update_run(engine, rid, status="queued", ended_at=None, exit_code=None, agent_pid=None)
    nproc = max(store.get_run(engine, rid).world_size for rid in run)
    if detach:
        pid = scheduler.detach(db, run, nproc, 1)
        console.print(f"resuming runs {', '.join(map(str, run))} in the background (pid {pid})")
        return
    _run_with_progress(engine, db, run, nproc, 1)


@app.command()
def kill(
    run: Annotated[list[int] | None, typer.Argument(help="run ids")] = None,
    all_: Annotated[bool, typer.Option("--all", help="every queued or running run")] = False,
    db: DbOpt = None,
) -> None:
    """Stop runs now (their process group, or their SLURM job) and mark them killed."""
    from attnres import scheduler
    from attnres.tracking import store
    from attnres.tracking.db import get_engine

    engine = get_engine(db, create=False)
    if all_:
        ids = [r.id for r in store.active_runs(engine)]
    elif run:
        ids = [store.get_run(engine, r).id for r in run]
    else:
        raise AttnresError("name run ids, or pass --all")
    done = scheduler.kill(engine, ids)
    console.print(f"killed {len(done)} run(s){': ' + ', '.join(map(str, done)) if done else ''}")


@app.command()
def logs(
    run: Annotated[int, typer.Argument(help="run id")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing until the run ends")] = False,
    lines: Annotated[int, typer.Option("-n", help="last lines to show")] = 40,
    db: DbOpt = None,
) -> None:
    """Show a run's log (stdout and stderr of its torchrun job)."""
    import time

    from attnres.tracking import store
    from attnres.tracking.db import get_engine
    from attnres.tracking.schema import ACTIVE

    engine = get_engine(db, create=False)
    r = store.get_run(engine, run)
    path = Path(r.log_path) if r.log_path else None
    if path is None or not path.exists():
        raise AttnresError(f"run {run} has no log yet")
    with path.open(errors="replace") as fh:
        for line in fh.readlines()[-lines:]:
            console.print(line.rstrip("\n"), markup=False, highlight=False)
        while follow:
            line = fh.readline()
            if line:
                console.print(line.rstrip("\n"), markup=False, highlight=False)
                continue
            if store.get_run(engine, run).status not in ACTIVE:
                break
            time.sleep(0.5)


@app.command()
def status(
    watch: Annotated[bool, typer.Option("--watch", help="live grid view: variants x seeds, until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="--watch refresh seconds")] = 2.0,
    db: DbOpt = None,
) -> None:
    """Live state of every run (runs whose process died are marked failed first)."""
    from attnres import slurm
    from attnres.launch import reconcile
    from attnres.listing import grid_rows, status_rows
    from attnres.tracking.db import get_engine

    engine = get_engine(db, create=False)
    if watch:
        from rich.live import Live

        def render() -> Table:
            reconcile(engine)
            slurm.reconcile(engine)
            header, rows = grid_rows(engine)
            table = Table(title="attnres grid (Ctrl-C to leave)")
            for col in header:
                table.add_column(col)
            for row in rows:
                table.add_row(*row)
            return table

        try:
            with Live(render(), console=console, refresh_per_second=4) as live:
                while True:
                    time.sleep(interval)
                    live.update(render())
        except KeyboardInterrupt:
            return
    reconcile(engine)
    slurm.reconcile(engine)
    rows = status_rows(engine)
    if not rows:
        console.print("no runs yet: start one with `attnres launch standard --seeds 42`")
        return
    table = Table(title="attnres runs")
    for col in rows[0]:
        left = col in {"variant", "status"}
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    colors = {"finished": "green", "running": "cyan", "queued": "white", "preempted": "yellow"}
    for row in rows:
        cells = [str(v) for v in row.values()]
        cells[2] = f"[{colors.get(row['status'].split()[0], 'red')}]{cells[2]}[/]"
        table.add_row(*cells)
    console.print(table)


@app.command()
def report(
    out: Annotated[Path, typer.Option("--out", help="markdown file to write")] = Path("attnres-results.md"),
    baseline: Annotated[str, typer.Option(help="variant every Δ is measured against")] = "standard",
    step: Annotated[int | None, typer.Option(help="eval step to compare (default: largest common)")] = None,
    plots: Annotated[bool, typer.Option(help="write PNG figures under reports/ beside --out")] = True,
    db: DbOpt = None,
) -> None:
    """Write the results document (every table of the hand-made one) from the database."""
    from attnres.reporting import write_report
    from attnres.tracking.db import get_engine
    from attnres.variants import canonical

    write_report(get_engine(db, create=False), out, canonical(baseline), step, plots)
    console.print(f"wrote {out}")


@app.command()
def compare(
    variant: Annotated[list[str], typer.Argument(help="two or more variants; Δ is against the first")],
    step: Annotated[int | None, typer.Option(help="step for the seed statistics (default: last common)")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="also write the comparison as markdown")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="save the eval-curve overlay (PNG)")] = None,
    db: DbOpt = None,
) -> None:
    """Compare variants side by side: aligned eval losses, seed statistics, config, cost."""
    from attnres.reporting import compare as run_compare
    from attnres.tracking.db import get_engine

    result = run_compare(get_engine(db, create=False), variant, step, plot)
    _print_frame(result.aligned, "Eval loss at common steps (seed mean)", ".4f")
    _print_frame(result.stats, f"Statistics over seeds at step {result.step} (Welch t vs {result.variants[0]})", ".4f")
    if len(result.config):
        _print_frame(result.config, "Config differences")
    _print_frame(result.cost, "Throughput and memory", ",.1f")
    if out:
        out.write_text(result.markdown())
        console.print(f"wrote {out}")
    if plot:
        console.print(f"wrote {plot}")


def _print_frame(df: object, title: str, floatfmt: str = "") -> None:
    import pandas as pd

    assert isinstance(df, pd.DataFrame)
    table = Table(title=title)
    for col in df.columns:
        table.add_column(str(col), justify="right" if pd.api.types.is_numeric_dtype(df[col]) else "left")
    for row in df.itertuples(index=False):
        table.add_row(*[format(v, floatfmt) if floatfmt and isinstance(v, float) else str(v) for v in row])
    console.print(table)


MULTI_VALUE = {"--seeds"}


def expand_multi(argv: list[str]) -> list[str]:
    """Let list options take several values (``--seeds 42 1337``), as click wants ``--seeds 42 --seeds 1337``."""
    out: list[str] = []
    current = None
    for arg in argv:
        if arg in MULTI_VALUE:
            current = arg
            continue
        if current and not arg.startswith("-"):
            out += [current, arg]
            continue
        if current and out[-2:-1] != [current]:
            out.append(current)  # a bare flag: let click report the missing value
        current = None
        out.append(arg)
    if current and out[-2:-1] != [current]:
        out.append(current)
    return out


def main() -> None:
    """Entry point: bad input is one line on stderr and exit code 2, never a traceback."""
    try:
        code = app(args=expand_multi(sys.argv[1:]), prog_name="attnres", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except AttnresError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except SQLAlchemyError as exc:
        msg = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        err.print(f"error: database: {msg}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except Exception as exc:  # click usage errors come through here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            hint = f" (see `attnres {exc.ctx.info_name} --help`)" if getattr(exc, "ctx", None) else ""
            err.print(f"error: {exc.format_message()}{hint}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(2)
        raise


import cli.tools  # noqa: E402,F401  (registers its commands on app)

if __name__ == "__main__":
    main()
