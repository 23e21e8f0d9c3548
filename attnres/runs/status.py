"""What ``attnres status`` shows: a row per run, or a grid of variants (x swept settings) x seeds, from the database;
and what ``attnres logs`` says of a run whose log is not there."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

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
GONE_MARK = " — process gone, end not recorded"  # beside a running run's state: see unrecorded()
KEYS = ["train_loss", "eval_loss", "peak_memory_bytes"]  # (tok/s: the mean of its logged intervals)


def status_rows(store: RunStore, experiment: str | None = None, preset: str | None = None,
                recent: int | None = RECENT, gone: Mapping[int, str] | None = None,
                ) -> tuple[list[dict[str, object]], int]:
    """One row per run with its progress and latest metrics: every active run and the ``recent`` newest
    (None: every run) of one experiment or preset, or all; and how many runs match in all. A run recorded
    running whose process is gone (``gone``, from :func:`unrecorded`) says so beside its state.

    Plain rows and primary-key lookups (no ORM, no pandas, no torch): the command answers at once
    however many runs and metric rows the database holds. It only reads: :func:`reconcile` first brings the
    rows up to date.
    """
    runs, total = store.status_runs(experiment, preset, recent)
    last = store.latest_values([int(r["id"]) for r in runs], KEYS)
    mean = store.mean_values([int(r["id"]) for r in runs], ["tokens_per_s"])  # (as a report gives a run's)
    cells = grid.cell_labels([(r["experiment"], r["preset"], r["total_steps"]) for r in runs],
                             [str(r["variant"]) for r in runs], [grid.settings(r["config_json"]) for r in runs])
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
            + silent(r["status"], r["heartbeat_at"])
            + (GONE_MARK if r["status"] == states.RUNNING and int(r["id"]) in (gone or {}) else ""),
            "seed": r["seed"], "step": f"{r['step']}/{r['total_steps']}",
            "train loss": _fmt(m.get("train_loss"), ".3f"), "eval loss": _fmt(m.get("eval_loss"), ".3f"),
            "mean tok/s": _fmt(mean[int(r["id"])].get("tokens_per_s"), ",.0f"),
            "memory MiB": _fmt(None if memory is None else memory / 2**20, ",.0f"),
        })
    return rows, total


def silent(status: object, heartbeat_at: object, now: datetime | None = None) -> str:
    """`` (no heartbeat for 2m10s)`` for a running run not heard from for longer than a live one can be silent
    (``$ATTNRES_STALE_AFTER_S``, default :data:`attnres.runs.backends.HEARTBEAT_SILENCE_S`), '' otherwise.

    A run on this host stays running while its process lives, however old its heartbeat (a locked database
    stops heartbeats, not training), and a run elsewhere until the monitor judges it: its status alone would hide
    that nothing was heard from it for minutes. ``heartbeat_at`` is a datetime, or the text SQLite gives back.
    """
    if status != states.RUNNING or heartbeat_at is None:
        return ""
    from attnres.runs.backends import HEARTBEAT_SILENCE_S  # (imported already: a running run made status reconcile)

    try:
        beat = heartbeat_at if isinstance(heartbeat_at, datetime) else datetime.fromisoformat(str(heartbeat_at))
        limit = float(os.environ.get("ATTNRES_STALE_AFTER_S", HEARTBEAT_SILENCE_S))
    except ValueError:
        return ""
    age = ((now or datetime.now(UTC).replace(tzinfo=None)) - beat.replace(tzinfo=None)).total_seconds()
    return f" (no heartbeat for {duration(age)})" if age > limit else ""


def reconcile(store: RunStore, experiment: str | None = None, preset: str | None = None,
              recent: int | None = RECENT) -> list[str]:
    """What ``attnres status`` does before it reads, in one visible call: runs whose process or job is gone
    without an end are marked failed (their spools read first), and the finished runs it will show are
    checked whole (``incomplete``, with the missing ranges named, when the database lacks logged steps).

    A database that refuses the writes (read-only or immutable, a full disk, locked) leaves the runs as recorded,
    and status still shows them: returns the first line of each refused write (:func:`unrecorded` and
    :func:`gone_notes` then say which runs' ends are missing). The backends (and the ORM they write through)
    are imported only when some run is active: a finished grid's status needs neither.
    """
    from attnres.tracking.run_store import DatabaseError

    errors: list[str] = []
    try:
        if store.any_active():
            from attnres.runs import backends

            backends.reconcile(store, errors)
        runs, _ = store.status_runs(experiment, preset, recent)
        store.check_complete(runs, states.MONITOR)
    except (DatabaseError, OSError) as exc:
        from attnres.runs.backends import first_line

        errors.append(first_line(exc))
    return errors


def unrecorded(store: RunStore) -> dict[int, str]:
    """The runs recorded running whose process or job is gone now, with why: their end is not in the database
    yet (it refused the write, or another process is at the run). Only looks (a process check, one squeue)."""
    if not store.any_active():
        return {}
    from attnres.runs import backends

    return backends.gone(store)


def gone_notes(rows: list[dict[str, object]], gone: Mapping[int, str], errors: list[str]) -> list[str]:
    """What status says under its table of the shown runs whose end is not recorded (``gone``), and of a
    database that refused a write (``errors``, from :func:`reconcile`)."""
    shown = [int(r["run"]) for r in rows if int(r["run"]) in gone and str(r["status"]).split()[0] == states.RUNNING]
    refused = f" (a write was refused: {errors[0]})" if errors else ""
    notes = [f"run {rid} is recorded running, but {gone[rid] or 'its process is gone'}; the database does not say so"
             f" yet{refused}: the next `attnres status` that can write it records the run's end" for rid in shown]
    if errors and not shown:
        notes.append(f"a write was refused ({errors[0]}): the runs are shown as recorded; the next "
                     "`attnres status` that can write it brings them up to date")
    return notes


def _cell(run: pd.Series, now: datetime) -> str:
    """One grid cell: state, progress and, while running, an ETA from the pace so far (at ``now``)."""
    import pandas as pd

    text = f"{run.status} {run.step}/{run.total_steps}"
    if run.status == states.RUNNING and run.step and pd.notna(run.started_at):
        elapsed = (now - run.started_at).total_seconds()
        eta = elapsed / run.step * (run.total_steps - run.step)
        text += f" ETA {duration(eta)}"
    if pd.notna(run.stop_step):
        text += f" @{int(run.stop_step)}"
    return text


def grid_rows(store: RunStore, experiment: str | None = None,
              preset: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Variant rows x seed columns (per experiment); each cell is the latest run of that pair."""
    runs = store.runs_frame(experiment=experiment, preset=preset)  # (the ORM and pandas: not `attnres status`'s)
    now = states.now()
    if runs.empty:
        return ["variant"], [["no runs yet"]]
    seeds = sorted(runs["seed"].unique())
    runs["settings"] = grid.cell_labels(list(zip(runs["experiment"], runs["preset"], runs["total_steps"], strict=True)),
                                        list(runs["variant"]), [grid.settings(c) for c in runs["config_json"]])
    keys = ["experiment", "variant", "settings"]
    latest = runs.sort_values("id").groupby([*keys, "seed"]).tail(1).set_index([*keys, "seed"])
    swept = bool(runs["settings"].any())
    rows = []
    for exp, variant, cell in dict.fromkeys(zip(runs["experiment"], runs["variant"], runs["settings"], strict=True)):
        rows.append([exp, variant, *([cell or "—"] if swept else [])]
                    + [_cell(latest.loc[(exp, variant, cell, s)], now) if (exp, variant, cell, s) in latest.index
                       else "—" for s in seeds])
    return ["experiment", "variant", *(["settings"] if swept else []), *[f"seed {s}" for s in seeds]], rows


def slot_waits(rows: list[dict[str, object]]) -> list[str]:
    """What the queued runs among ``rows`` wait for: who holds the machine's run slots (a run of this or
    another database, its queue's pid, since when), read from the slot files; none when no run is queued."""
    if not any(str(r["status"]).split()[0] == states.QUEUED for r in rows):
        return []
    from attnres.runs.backends.slots import holders  # (psutil: only when a run is queued)

    held = holders()
    if not held:
        return ["queued runs start as soon as their queue takes a free run slot (none is held now)"]
    return [f"queued runs wait for a run slot; held: {h.text()}" for h in held]


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
