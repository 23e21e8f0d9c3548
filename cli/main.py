"""The ``attnres`` command: parse arguments, call the library, render with rich. No logic here."""

from __future__ import annotations

import importlib
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from attnres.cli.app import (
    RUN_ID_MAX,
    DbOpt,
    ExperimentOpt,
    PresetOpt,
    SeedsOpt,
    app,
    console,
    err,
    expand_multi,
)
from attnres.cli.bars import RunBars
from attnres.cli.render import show_cell, submit
from attnres.errors import AttnresError
from attnres.runs import DEFAULT_BACKEND
from attnres.tracking import is_database_error
from attnres.tracking.run_store import RunStore

if TYPE_CHECKING:
    from attnres.runs.backends import Placement, Submitted
    from attnres.runs.planning import LaunchRequest


@app.command()
def variants(
    params: Annotated[bool, typer.Option("--params", help="count parameters at --preset")] = False,
    preset: Annotated[str, typer.Option(help="preset for --params")] = "tiny",
    set_: Annotated[list[str] | None, typer.Option("--set", help="with --params: count at KEY=VALUE (repeatable), "
                                                   "as `attnres launch --set` trains")] = None,
) -> None:
    """List every residual variant: name, description, depth sources, extra parameters."""
    from attnres.training.optim import RULE
    from attnres.variants.describe import FLOPS_NOTE, PARAMS_NOTE, SHAPE_NOTE, flops_rows, variant_rows

    if set_ and not params:
        raise AttnresError("--set counts parameters at those settings: give --params too")
    at = preset + "".join(f" {s}" for s in set_ or [])
    tables = [(f"Residual variants{f' at {at}' if params else ''}", variant_rows(preset if params else None, set_))]
    if params:
        tables.append((f"Training compute at {at}", flops_rows(preset, set_)))
    for title, rows in tables:
        table = Table(title=title, show_lines=not params, box=box.SIMPLE_HEAD if params else box.HEAVY_HEAD,
                      pad_edge=False)
        for col in rows[0]:
            text = col in {"variant", "description", "changes vs control_block"}
            table.add_column(col, overflow="fold", justify="left" if text else "right", no_wrap=not text)
        for row in rows:
            table.add_row(*[str(v) for v in row.values()])
        console.print(table)
        if params:
            console.print(FLOPS_NOTE if title.startswith("Training") else PARAMS_NOTE)
    console.print(SHAPE_NOTE)
    console.print(RULE)


@app.command()
def launch(
    variant: Annotated[list[str], typer.Argument(help="variant names (see `attnres variants`)")],
    seeds: SeedsOpt = None,
    preset: Annotated[str, typer.Option(help="model/training size")] = "tiny",
    experiment: Annotated[str | None, typer.Option(help="experiment the runs belong to (default: the preset)")] = None,
    steps: Annotated[int | None, typer.Option(help="override the preset's training steps")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override KEY=VALUE (repeatable); KEY=A,B,... "
                                                   "sweeps it")] = None,
    data: Annotated[str, typer.Option(help="prepared dataset name or folder")] = "builtin",
    nproc: Annotated[int, typer.Option(help="processes (ranks) per run on CPU")] = 1,
    gpus_per_run: Annotated[int | None, typer.Option(help="GPUs per run (local backend; default 1)")] = None,
    detach: Annotated[bool, typer.Option(help="return at once; the queue runs in the background")] = False,
    force: Annotated[bool, typer.Option(help="run even if finished with the same config")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan and torchrun commands only")] = False,
    kill_if_worse_than: Annotated[str | None, typer.Option(help="early-stop rule: baseline variant")] = None,
    by: Annotated[float, typer.Option(help="early-stop rule: margin in eval loss")] = 0.1,
    at_step: Annotated[int | None, typer.Option(min=1, help="early-stop rule: eval step to check")] = None,
    backend: Annotated[str, typer.Option(help="where runs execute: local | slurm | inline (in this "
                                               "process)")] = DEFAULT_BACKEND,
    partition: Annotated[str | None, typer.Option(help="SLURM partition")] = None,
    nodes: Annotated[int | None, typer.Option(min=1, help="SLURM nodes per run (default 1)")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(min=0, help="SLURM GPUs per node (default 0: CPU, --nproc "
                                                      "ranks)")] = None,
    time_limit: Annotated[str | None, typer.Option("--time", help="SLURM time limit")] = None,
    backend_opt: Annotated[list[str] | None, typer.Option("--backend-opt", help="KEY=VALUE: any option of the "
                                                          "backend (its typed options)")] = None,
    mirror: Annotated[list[str] | None, typer.Option("--mirror", help="also send each run to mlflow[=URI], "
                                                     "trackio[=PROJECT] or wandb[=PROJECT] (repeatable; none: "
                                                     "not even the database's or ATTNRES_MIRROR's)")] = None,
    on_end: Annotated[str | None, typer.Option("--on-end", help="command run when each run ends, with ATTNRES_RUN_ID, "
                                               "ATTNRES_STATE, ATTNRES_LAST_EVAL, ... in its environment "
                                               "(split like a shell line; no shell runs it)")] = None,
    db: DbOpt = None,
) -> None:
    """Train every VARIANT x swept value x seed with torchrun, recording runs and metrics in the database.

    `--set lr=3e-4,1e-3` sweeps a setting (several swept settings make a product)."""
    from attnres.runs import planning

    flags = {"gpus_per_run": gpus_per_run, "nodes": nodes, "gpus_per_node": gpus_per_node, "partition": partition,
             "time_limit": time_limit}  # each backend takes its own (given ones only: the rest are its defaults)
    req = planning.request(variant, seeds, preset, steps, set_, data, backend, placement_of(backend, nproc, flags,
                           backend_opt), kill_if_worse_than, by, at_step, force, experiment, mirror, on_end)
    if warning := planning.on_end_warning(on_end):
        err.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    start_runs(req, detach, dry_run, db)


def placement_of(backend: str, nproc: int, flags: dict[str, object], backend_opt: list[str] | None) -> Placement:
    """How each run is placed: ``--nproc`` ranks, and the backend's own options (its flags given, and
    ``--backend-opt KEY=VALUE``), typed and checked by the backend."""
    from attnres.runs import backends

    given = {k: v for k, v in flags.items() if v is not None} | key_values(backend_opt or [], "--backend-opt")
    return backends.get(backend).placement(nproc, given)


def start_runs(req: LaunchRequest, detach: bool, dry_run: bool, db: str | None) -> None:
    """What `launch` and `scale` do with the request they built: check its data, print the plan, and (unless a dry
    run) start the queue."""
    from attnres.runs import backends, orchestrator, planning
    from attnres.runs.ladder import warning as ladder_warning
    from attnres.tracking import normalize_url
    from attnres.variants.describe import model_line

    backends.get(req.backend).check_detach(detach)
    planning.check_request_data(req)  # its data and windows, before the database is opened (a dry run too)
    for warning in (backends.get(req.backend).warning(req.placement),
                    ladder_warning([r.size for r in req.ladder]) if req.ladder else None):
        if warning:
            err.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    for rung in req.ladder:
        console.print(f"size {rung.size.label}: {rung.non_embedding:,} non-embedding parameters, "
                      f"{rung.tokens:,} tokens -> {int(rung.settings['steps']):,} steps", markup=False, highlight=False)
    url = normalize_url(db)
    store = None if dry_run else RunStore(db)
    if store is not None:
        orchestrator.reconcile(store)  # after a crash: its dead runs end (and continue below) before planning
    cells = planning.plan(store, req)
    for c in cells:
        show_cell(c)
        if dry_run and not c.skip:  # what the backend would run: a torchrun command here, a job script on SLURM
            console.print("  " + model_line(c.cfg.model), soft_wrap=True, markup=False, highlight=False)
            for line in backends.get(req.backend).describe(c.run_id or "{run_id}", url, req.placement):
                console.print("  " + line, soft_wrap=True, markup=False, highlight=False)
    if dry_run or all(c.skip for c in cells):
        return
    submit(store, lambda bars: orchestrator.launch(store, req, cells, detach=detach, on_queued=bars.watch)[1])


def key_values(items: list[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict (one clear line for one without ``=``)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AttnresError(f"bad {option} '{item}': expected KEY=VALUE")
        out[key] = value
    return out


@app.command()
def resume(
    run: Annotated[list[int], typer.Argument(min=1, max=RUN_ID_MAX, help="run ids to continue from their last "
                                             "checkpoint")],
    detach: Annotated[bool, typer.Option(help="return at once; the queue runs in the background")] = False,
    restart: Annotated[bool, typer.Option(help="start over from step 0 (checkpoints are set aside, kept)")] = False,
    db: DbOpt = None,
) -> None:
    """Continue interrupted runs (failed, killed, preempted, incomplete) from their last checkpoint."""
    from attnres.runs import orchestrator

    store = RunStore(db, create=False)

    def start(bars: RunBars) -> Submitted:
        bars.watch(list(run))
        return orchestrator.resume(store, run, detach=detach, restart=restart, on_tick=bars.tick)

    submit(store, start)


@app.command()
def kill(
    run: Annotated[list[int] | None, typer.Argument(min=1, max=RUN_ID_MAX, help="run ids")] = None,
    all_: Annotated[bool, typer.Option("--all", help="every queued or running run")] = False,
    db: DbOpt = None,
) -> None:
    """Stop runs now (their process group, or their SLURM job) and mark them killed."""
    from attnres.runs import orchestrator

    if not all_ and not run:
        raise AttnresError("name run ids, or pass --all")
    done = orchestrator.kill(RunStore(db, create=False), None if all_ else run)
    console.print(f"killed {len(done)} run(s){': ' + ', '.join(map(str, done)) if done else ''}")


@app.command()
def logs(
    run: Annotated[int, typer.Argument(min=1, max=RUN_ID_MAX, help="run id")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing until the run ends")] = False,
    lines: Annotated[int, typer.Option("-n", min=0, help="last lines to show")] = 40,
    db: DbOpt = None,
) -> None:
    """Show a run's log (stdout and stderr of its torchrun job)."""
    from attnres.runs import backends

    store = RunStore(db, create=False)
    r = store.run(run)
    for line in backends.get(backends.backend_of(r)).logs(store, r, lines, follow):
        console.print(line, markup=False, highlight=False)


@app.command()
def status(
    watch: Annotated[bool, typer.Option("--watch", help="live grid view: variants x seeds, until Ctrl-C (piped: "
                                        "plain lines each refresh, until no run is queued or running with a process "
                                        "here)")] = False,
    interval: Annotated[float, typer.Option(min=0.1, max=3600, help="--watch refresh seconds")] = 2.0,
    all_: Annotated[bool, typer.Option("--all", help="every run (default: the active and 20 most recent)")] = False,
    experiment: ExperimentOpt = None,
    preset: PresetOpt = None,
    db: DbOpt = None,
) -> None:
    """Live state of the runs: active ones and the most recent. Only reads: a run whose process is gone is shown
    so, and `attnres sync` records it."""

    from attnres.runs.status_view import RECENT, going, grid_rows, shown, unrecorded
    from attnres.tracking import states

    if not RunStore.exists(db):  # nothing launched here yet: an empty listing, not an error (and no file made)
        console.print("no runs yet: start one with `attnres launch standard --seeds 42`")
        return
    store = RunStore(db, create=False, busy_s=1.0, quick=True)  # reads what it can now; never waits on a lock
    if watch and not console.is_terminal:
        # piped (`| tee`, a log, CI): a live view's cursor movement would be garbage there, so each refresh is a
        # time line and the grid's rows as plain aligned text; it ends by itself once no run in the view is
        # queued or running with a process here to run it, so the pipe does too
        try:
            while True:
                pending = unrecorded(store)  # (one look at the processes a refresh)
                header, rows = grid_rows(store, experiment, preset, pending)
                active, heading = going(store, experiment, preset, pending)
                widths = [max(len(r[i]) for r in [header, *rows] if i < len(r)) for i in range(len(header))]
                console.print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {heading}",
                              markup=False, highlight=False, soft_wrap=True)
                for row in [header, *rows]:
                    console.print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip(),
                                  markup=False, highlight=False, soft_wrap=True)
                console.file.flush()  # each refresh reaches the pipe now, not when a buffer fills
                if not active:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return
    if watch:
        from rich.live import Live

        def render() -> Table:
            header, rows = grid_rows(store, experiment, preset)
            table = Table(title="attnres grid (Ctrl-C to leave)")
            for col in header:
                table.add_column(col)
            for row in rows:
                table.add_row(*map(Text, row))  # data, never markup
            return table

        try:
            with Live(render(), console=console, refresh_per_second=4) as live_view:
                while True:
                    time.sleep(interval)
                    live_view.update(render())
        except KeyboardInterrupt:
            return
    found = shown(store, experiment, preset, None if all_ else RECENT)
    rows = found.rows
    if not rows:
        console.print("no runs match the filter" if experiment or preset
                      else "no runs yet: start one with `attnres launch standard --seeds 42`")
        return
    table = Table(title="attnres runs")
    for col in rows[0]:
        left = col in {"experiment", "variant", "settings", "status"}
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    colors = {states.FINISHED: "green", states.RUNNING: "cyan", states.QUEUED: "white", states.PREEMPTED: "yellow"}
    at = list(rows[0]).index("status")
    for row in rows:  # cells as Text: an experiment named `x[/bold]y` is shown as it is, never read as markup
        cells = [Text(str(v)) for v in row.values()]
        cells[at].stylize(colors.get(str(row["status"]).split()[0], "red"))
        table.add_row(*cells)
    if len(rows) < found.total:
        table.caption = (f"{len(rows)} of {found.total} runs: the active ones and the {RECENT} most recent "
                         "(--all for every run)")
    console.print(table)
    for line in found.notes:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    """Entry point: bad input is one line on stderr and exit code 2, never a traceback."""
    try:
        code = app(args=expand_multi(sys.argv[1:]), prog_name="attnres", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except AttnresError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except Exception as exc:  # click usage errors come through here in non-standalone mode
        if is_database_error(exc):
            msg = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            err.print(f"error: database: {msg}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(2)
        # typer may vendor its own click: recognise its usage errors by class name, not by import
        if any(c.__name__ == "ClickException" for c in type(exc).__mro__):
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `attnres {ctx.info_name} --help`)" if ctx is not None else ""
            err.print(f"error: {exc.format_message()}{hint}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(2)
        raise


# each module registers its verbs on app; `attnres --help` lists them in this order
for _verbs in ("scale_cmd", "documents", "next_cmd", "study_cmd", "files_cmd", "database_cmd", "bench_cmd"):
    importlib.import_module(f"attnres.cli.{_verbs}")

if __name__ == "__main__":
    main()
