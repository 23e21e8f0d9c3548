"""What ``attnres status`` shows: a row per run, or a grid of variants (x swept settings) x seeds, from the database;
and what ``attnres logs`` says of a run whose log is not there."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from attnres import run_settings
from attnres.durations import duration
from attnres.runs import grid
from attnres.tracking import states
from attnres.variants.registry import superseded_runs

if TYPE_CHECKING:
    import pandas as pd

    from attnres.tracking.run_store import RunStore


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None or x != x else format(x, spec)


RECENT = 20  # runs `attnres status` lists beside the active ones, unless --all
# beside a run's recorded state, what the database does not record yet (`attnres sync` records it)
GONE_MARK = " — process gone, end not recorded"
ORPHAN_MARK = " — its queue is gone"
JOB_GONE_MARK = " — its job is gone"
HOLES_MARK = " — rows missing, not recorded incomplete"
KEYS = ["train_loss", "eval_loss", "peak_memory_bytes"]  # (tok/s: the mean of its logged intervals)


@dataclass(frozen=True)
class Shown:
    """What `attnres status` shows: its rows, how many runs match in all, and the notes under its table."""

    rows: list[dict[str, object]]
    total: int
    notes: list[str]


def shown(store: RunStore, experiment: str | None = None, preset: str | None = None,
          recent: int | None = RECENT) -> Shown:
    """Status's table and notes, read only: each run's recorded state, and beside it what the database does not
    record yet (a process gone without an end, a queue gone, rows missing from a finished run) with the command
    that records it. Nothing is written: the reconciler (`attnres sync`, the write verbs) records those."""
    pending = unrecorded(store)
    runs, total = store.status_runs(experiment, preset, recent)
    holes = store.missing([r for r in runs if r["status"] == states.FINISHED])
    rows = _rows(store, runs, pending, holes)
    notes = [*pending_notes(rows, pending, holes), *why_notes(store, rows), *waits(store, rows, pending),
             *resume_note(rows)]
    return Shown(rows, total, notes)


def status_rows(store: RunStore, experiment: str | None = None, preset: str | None = None,
                recent: int | None = RECENT) -> tuple[list[dict[str, object]], int]:
    """One row per run with its progress and latest metrics (every active run and the ``recent`` newest, None:
    every run, of one experiment or preset, or all), as recorded; and how many runs match in all."""
    runs, total = store.status_runs(experiment, preset, recent)
    return _rows(store, runs, {}, {}), total


def _rows(store: RunStore, runs: list[dict[str, object]], pending: Mapping[int, tuple[str, str]],
          holes: Mapping[int, str]) -> list[dict[str, object]]:
    """Plain rows and primary-key lookups (no ORM, no pandas, no torch): the command answers at once however
    many runs and metric rows the database holds. A state the database does not record yet (``pending``,
    ``holes``) is said beside the recorded one."""
    last = store.latest_values([int(r["id"]) for r in runs], KEYS)
    mean = store.mean_values([int(r["id"]) for r in runs], ["tokens_per_s"])  # (as a report gives a run's)
    cells = grid.cell_labels([(r["experiment"], r["preset"], r["total_steps"]) for r in runs],
                             [str(r["variant"]) for r in runs], [run_settings.settings(r["config_json"]) for r in runs])
    old = superseded_runs([(str(r["variant"]), str(r["config_json"])) for r in runs])
    rows = []
    for r, cell, old_revision in zip(runs, cells, old, strict=True):
        m = last[int(r["id"])]
        memory = m.get("peak_memory_bytes")
        rows.append({
            "run": r["id"], "experiment": r["experiment"],
            "variant": str(r["variant"]) + (" (old revision)" if old_revision else ""),
            **({"settings": cell or "—"} if any(cells) else {}),
            "status": str(r["status"]) + (f" @{int(r['stop_step'])}" if r["stop_step"] is not None else "")
            + silent(r["status"], r["heartbeat_at"]) + mark(str(r["status"]), int(r["id"]), pending, holes),
            "seed": r["seed"], "step": f"{r['step']}/{r['total_steps']}",
            "train loss": _fmt(m.get("train_loss"), ".3f"), "eval loss": _fmt(m.get("eval_loss"), ".3f"),
            "mean tok/s": _fmt(mean[int(r["id"])].get("tokens_per_s"), ",.0f"),
            "memory MiB": _fmt(None if memory is None else memory / 2**20, ",.0f"),
        })
    return rows


def mark(status: str, run_id: int, pending: Mapping[int, tuple[str, str]], holes: Mapping[int, str]) -> str:
    """What to say beside a run's recorded state of what the database does not record yet ('' for nothing)."""
    if run_id in pending and status == states.QUEUED:  # (its queue gone: preempted; a cluster's job gone: failed)
        return ORPHAN_MARK if pending[run_id][0] == states.PREEMPTED else JOB_GONE_MARK
    if run_id in pending:
        return GONE_MARK if status == states.RUNNING else ""
    return HOLES_MARK if status == states.FINISHED and run_id in holes else ""


def silent(status: object, heartbeat_at: object, now: datetime | None = None) -> str:
    """`` (no heartbeat for 2m10s)`` for a running run not heard from for longer than a live one can be silent
    (``$ATTNRES_STALE_AFTER_S``, default :data:`attnres.runs.backends.HEARTBEAT_SILENCE_S`), '' otherwise.

    A run on this host stays running while its process lives, however old its heartbeat (a locked database
    stops heartbeats, not training), and a run elsewhere until the monitor judges it: its status alone would hide
    that nothing was heard from it for minutes. ``heartbeat_at`` is a datetime, or the text SQLite gives back.
    """
    if status != states.RUNNING or heartbeat_at is None:
        return ""
    from attnres.runs.backends import HEARTBEAT_SILENCE_S  # (imported already: a running run made status look)

    try:
        beat = heartbeat_at if isinstance(heartbeat_at, datetime) else datetime.fromisoformat(str(heartbeat_at))
        limit = float(os.environ.get("ATTNRES_STALE_AFTER_S", HEARTBEAT_SILENCE_S))
    except ValueError:
        return ""
    age = ((now or datetime.now(UTC).replace(tzinfo=None)) - beat.replace(tzinfo=None)).total_seconds()
    return f" (no heartbeat for {duration(age)})" if age > limit else ""


def unrecorded(store: RunStore) -> dict[int, tuple[str, str]]:
    """The ends the reconciler would record now (:func:`attnres.runs.backends.unrecorded`): {run: (state, why)}.
    Only looks (a process check, one squeue); the backends are imported only when some run is active."""
    if not store.any_active():
        return {}
    from attnres.runs import backends

    return backends.unrecorded(store)


def pending_notes(rows: list[dict[str, object]], pending: Mapping[int, tuple[str, str]],
                  holes: Mapping[int, str]) -> list[str]:
    """What status says under its table of each shown run whose state the database does not record yet, and of
    the command that records it (`attnres sync`: status itself only reads)."""
    notes = []
    shown = {int(r["run"]): str(r["status"]).split()[0] for r in rows}
    for rid, state in shown.items():
        if rid in pending and state == states.RUNNING:
            why = pending[rid][1] or "its process is gone"
            notes.append(f"run {rid} is recorded running, but {why}: `attnres sync` records its end (the "
                         "trainer's own, from its spool, if it kept one; else failed)")
        elif rid in pending and state == states.QUEUED and pending[rid][0] != states.PREEMPTED:
            notes.append(f"run {rid} is recorded queued, but {pending[rid][1] or 'its job is gone'}: `attnres sync` "
                         f"records it {pending[rid][0]}")
        elif rid in holes and state == states.FINISHED:
            notes.append(f"run {rid} is recorded finished, but the database lacks {holes[rid]}: `attnres sync` "
                         f"brings them from a spool that holds them (else records the run incomplete), "
                         f"`attnres resume {rid}` retrains them")
    orphans = [rid for rid, state in shown.items()
               if rid in pending and state == states.QUEUED and pending[rid][0] == states.PREEMPTED]
    if orphans:
        ids = " ".join(map(str, orphans))
        many = len(orphans) > 1
        notes.append(f"run{'s' if many else ''} {', '.join(map(str, orphans))} {'are' if many else 'is'} queued, but "
                     f"{'their' if many else 'its'} queue is gone: `attnres sync` records {'them' if many else 'it'} "
                     f"preempted; `attnres resume {ids}` (or the same launch again) starts {'them' if many else 'it'}")
    return notes


def waits(store: RunStore, rows: list[dict[str, object]], pending: Mapping[int, tuple[str, str]]) -> list[str]:
    """What the shown queued runs wait for, each backend saying it for its own (the local queue: who holds the
    machine's run slots); none when no shown run is queued (the backends are not even imported)."""
    queued = [int(r["run"]) for r in rows
              if str(r["status"]).split()[0] == states.QUEUED and int(r["run"]) not in pending]
    if not queued:
        return []
    from attnres.runs import backends

    return backends.waits(store, queued)


def going(store: RunStore, experiment: str | None = None, preset: str | None = None,
          pending: Mapping[int, tuple[str, str]] | None = None) -> tuple[list[int], str]:
    """The queued and running runs (of one experiment or preset, or all) that a process here still runs or will
    start, and the line `status --watch` heads each refresh with: what it waits for (a run whose process is gone,
    or one recorded elsewhere, never ends, and is counted apart). ``pending``: :func:`unrecorded`, if at hand."""
    active, _ = store.status_runs(experiment, preset, recent=0)
    if not active:
        return [], "0 run(s) queued or running"
    from attnres.runs.backends import REGISTRY, backend_of

    pending = unrecorded(store) if pending is None else pending
    watched = {r.id for r in store.active_runs() if backend_of(r) in REGISTRY}  # (an imported run: none here)
    ids = [int(r["id"]) for r in active if int(r["id"]) not in pending and int(r["id"]) in watched]
    rest = len(active) - len(ids)
    return ids, f"{len(ids)} run(s) queued or running" + (
        f" ({rest} more recorded so, with no process here: not waited for)" if rest else "")


def _cell(run: pd.Series, now: datetime, pending: Mapping[int, tuple[str, str]]) -> str:
    """One grid cell: state, progress and, while running, an ETA from the pace so far (at ``now``); a process or
    queue gone (``pending``) is said, never given an ETA."""
    import pandas as pd

    text = f"{run.status} {run.step}/{run.total_steps}" + mark(str(run.status), int(run.id), pending, {})
    if run.status == states.RUNNING and run.step and pd.notna(run.started_at) and int(run.id) not in pending:
        elapsed = (now - run.started_at).total_seconds()
        eta = elapsed / run.step * (run.total_steps - run.step)
        text += f" ETA {duration(eta)}"
    if pd.notna(run.stop_step):
        text += f" @{int(run.stop_step)}"
    return text


def grid_rows(store: RunStore, experiment: str | None = None, preset: str | None = None,
              pending: Mapping[int, tuple[str, str]] | None = None) -> tuple[list[str], list[list[str]]]:
    """Variant rows x seed columns (per experiment); each cell is the latest run of that pair. Read only.
    ``pending``: :func:`unrecorded`, if at hand."""
    runs = store.runs_frame(experiment=experiment, preset=preset)  # (the ORM and pandas: not `attnres status`'s)
    pending = unrecorded(store) if pending is None else pending
    now = states.now()
    if runs.empty:
        return ["variant"], [["no runs yet"]]
    seeds = sorted(runs["seed"].unique())
    runs["settings"] = grid.cell_labels(list(zip(runs["experiment"], runs["preset"], runs["total_steps"], strict=True)),
                                        list(runs["variant"]), [run_settings.settings(c) for c in runs["config_json"]])
    keys = ["experiment", "variant", "settings"]
    latest = runs.sort_values("id").groupby([*keys, "seed"]).tail(1).set_index([*keys, "seed"])
    swept = bool(runs["settings"].any())
    rows = []
    for exp, variant, cell in dict.fromkeys(zip(runs["experiment"], runs["variant"], runs["settings"], strict=True)):
        rows.append([exp, variant, *([cell or "—"] if swept else [])]
                    + [_cell(latest.loc[(exp, variant, cell, s)], now, pending)
                       if (exp, variant, cell, s) in latest.index else "—" for s in seeds])
    return ["experiment", "variant", *(["settings"] if swept else []), *[f"seed {s}" for s in seeds]], rows


def why_notes(store: RunStore, rows: list[dict[str, object]]) -> list[str]:
    """Why each shown run that ended short of finished did (failed, incomplete, diverged, stopped): the first line
    of its recorded message, which names what to do where there is something (``attnres resume``, ``sync``)."""
    short = {int(r["run"]): str(r["status"]).split()[0] for r in rows
             if str(r["status"]).split()[0] in (states.FAILED, states.INCOMPLETE, states.DIVERGED, states.STOPPED)}
    found = store.messages(list(short))
    return [f"run {rid} {short[rid]}: {found[rid].splitlines()[0][:300]}" for rid in sorted(found)]


def resume_note(rows: list[dict[str, object]]) -> list[str]:
    """The one command that continues the preempted runs among ``rows`` (stopped with a checkpoint, or never
    started because their queue died): a preempted run waits for nobody."""
    ids = [str(r["run"]) for r in rows if str(r["status"]).split()[0] == states.PREEMPTED]
    if not ids:
        return []
    return [f"preempted (stopped with a checkpoint, or never started because their queue is gone): runs "
            f"{', '.join(ids)}; `attnres resume {' '.join(ids)}` continues them"]
