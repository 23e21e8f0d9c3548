"""Keeping the record whole: `sync` (spools, mirrors), `mirror` (the default), `db upgrade`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnres.cli.app import RUN_ID_MAX, DbOpt, app, console, db_app, err
from attnres.errors import AttnresError

if TYPE_CHECKING:
    from attnres.tracking.run_store import RunStore


def _spool_files(files: list[Path] | None) -> list[Path] | None:
    """The named files, each identified as a run's spool at parse time: any other (a text file, a directory, a
    FIFO, a device, an unreadable one) is one line and exit 2, before the database or any file is touched."""
    if not files:
        return files
    from attnres.tracking.run_store import RunStore

    return [RunStore.spool_file(f) for f in files]


@app.command()
def sync(
    spool: Annotated[list[Path] | None, typer.Argument(callback=_spool_files, help="spool files (default: "
                                                       "logs/*.spool.jsonl); any other file is refused")] = None,
    mirror: Annotated[list[str] | None, typer.Option("--mirror", help="then send the runs to this mirror: what it "
                                                     "does not hold yet (mlflow[=URI], trackio[=PROJECT], "
                                                     "wandb[=PROJECT]; repeatable)")] = None,
    run: Annotated[list[int] | None, typer.Option("--run", min=1, max=RUN_ID_MAX, help="with --mirror: only this run "
                                                  "(repeatable; default every run)")] = None,
    db: DbOpt = None,
) -> None:
    """Write spooled metrics and run states (left when the database was unreachable) into the database;
    with --mirror, then send runs to a mirror (what a run's own mirroring missed, or runs from before)."""
    from attnres import mirrors
    from attnres.runs import orchestrator
    from attnres.tracking.run_store import RunStore

    targets = mirrors.specs(mirror) if mirror else []
    if run and not targets:
        raise AttnresError("--run selects the runs --mirror sends: give --mirror too")
    store = RunStore(db)
    done, changed = orchestrator.sync(store, spool)
    for path, got in done:
        extra = f", {got['runs']} run(s) recreated" if got["runs"] else ""
        extra += f", {got['skipped']} unreadable line(s) skipped" if got["skipped"] else ""
        console.print(f"{path}: {got['rows']:,} metric rows{extra}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"synced {len(done)} spool file(s): {sum(g['rows'] for _, g in done):,} rows")
    for rid in changed:  # what the reconciler recorded (what `attnres status` showed as not recorded yet)
        r = store.run(rid)
        why = f": {r.message.splitlines()[0][:200]}" if r.message else ""
        console.print(f"run {rid} recorded {r.status}{why}", markup=False, highlight=False, soft_wrap=True)
    if targets:
        _sync_mirrors(store, targets, run)


def _sync_mirrors(store: RunStore, targets: list[str], runs: list[int] | None) -> None:
    from rich.progress import Progress

    from attnres.mirrors.sender import sync as send

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("mirroring", total=None)
        done = send(store, targets, runs, on_run=lambda rid, spec, n: progress.update(
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
    from attnres.tracking.run_store import RunStore

    if spec and clear:
        raise AttnresError("give mirrors to set, or --clear, not both")
    store = RunStore(db)
    if spec or clear:
        store.set_default_mirrors(mirrors.specs(spec) if spec else None)
    now = store.default_mirrors()
    console.print(f"mirrors of this database: {' '.join(now) if now else 'none'}", markup=False, highlight=False)


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Migrate the database to this attnres's schema in place (Alembic), keeping every run: all or nothing
    (one transaction), and a SQLite file is first copied beside it (<file>.before-upgrade-<rev>-<time>, kept)."""
    from attnres.tracking import upgrade_database

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    before, after = upgrade_database(db, say=say)
    console.print(f"database schema: {before or 'empty'} -> {after}")
