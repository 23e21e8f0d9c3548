"""Export runs and metrics to CSV/Parquet, and import runs recorded elsewhere.

The metric file format is shared by both directions, so an export imports back unchanged.
One row per metric point, long format:

    run      optional  label grouping rows into one run (default: "<variant>-s<seed>")
    variant  required  a variant name (or alias) of the registry
    seed     required  a whole number from 0 to 2147483647 (launch's rule: attnres.config.SEED_RULE)
    step     required  integer
    key      required  metric name: eval_loss, train_loss, tokens_per_s, peak_memory_bytes, ...
    value    required  number
    status   optional  finished (default), running, diverged, stopped, failed, killed
    preset   optional  default "imported"
    experiment   optional  default: the preset
    total_steps  optional  the run's step budget (default: its last step if finished, else the
                           largest budget of the file's finished runs of the same preset)
    device   optional  what trained it, e.g. "4x NVIDIA B200" (the report's provenance)
    message  optional  why it ended (a failed or killed run's cause)
    launch   optional  which runs were launched together (a stage: see attnres.tracking.launches);
                       without it, the runs a file creates are one stage
    conditions  optional  what its throughput depends on: a JSON list of objects with device,
                       world_size, threads, compile, dtype (attnres.tracking.speed); on any one row

Depth-attention maps travel as keys ``depth:SITE:SOURCE`` (see attnres.tracking.depth_rows).

A run is identified by its label, variant and seed and by every column that scopes a report:
experiment, preset and (where the file gives it) total_steps. Rows that differ in one of them are
different runs, never merged: expA's and expB's ``standard-s42`` stay two runs. A row without a
scope value takes its run's (same label, variant and seed) where its other rows give one value.
Experiment and preset are names, checked as ``attnres launch --experiment`` checks them; device and
message are free text, stored as given and escaped where shown.

A CSV export is safe to open in a spreadsheet, and a file is read whole or refused: see
attnres.tracking.file_formats.

Importing the same file twice records every point once: a point (run, key, step) already stored
with the same value is counted, not written again; one stored with another value, or given two
values in one file, refuses the file (one line naming the row), as does a column named twice. A
file is recorded in one transaction (attnres.tracking.import_record): an import stopped halfway leaves
nothing, never a finished run without its rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from attnres import depth_keys, outputs
from attnres.config import EXPERIMENT_NAME, SEED_MAX, SEED_RULE
from attnres.errors import AttnresError
from attnres.tracking import file_formats, import_record, run_rows, states
from attnres.variants.registry import canonical

REQUIRED = ["variant", "seed", "step", "key", "value"]
SCOPE = ["preset", "experiment", "total_steps"]  # the columns that scope a report, part of a run's identity
IDENTITY = ["run", "variant", "seed", *SCOPE]  # one run of a file; with key and step, one point
DEFAULT_PRESET = "imported"
IMPORTED = "imported"  # the backend of a run recorded elsewhere: no process here to watch or stop
INT_MAX = 2**31 - 1  # INTEGER in PostgreSQL


def export(engine: Engine, out: Path, fmt: str = "csv", experiment: str | None = None,
           preset: str | None = None) -> list[Path]:
    """Write ``runs.<fmt>`` and ``metrics.<fmt>`` (of one experiment or preset, or all) into folder
    ``out``; return their paths."""
    if fmt not in {"csv", "parquet"}:
        raise AttnresError(f"unknown export format '{fmt}'; choose csv or parquet")
    outputs.check(out, folder=True, inside=(f"runs.{fmt}", f"metrics.{fmt}"))
    runs = run_rows.runs_frame(engine, experiment=experiment, preset=preset)
    if runs.empty and (experiment or preset):
        raise AttnresError("no runs match " + " and ".join(f"--{k} {v}" for k, v in
                                                           (("experiment", experiment), ("preset", preset)) if v))
    outputs.prepare(out, folder=True)
    metrics = run_rows.all_metrics(engine, runs["id"].tolist())
    cols = ["variant", "seed", "status", "preset", "experiment", "total_steps", "device", "message", "launch"]
    metrics = metrics.join(runs.rename(columns={"launch_id": "launch"}).set_index("id")[cols], on="run_id")
    # a run's conditions (JSON, see attnres.tracking.speed) on its first row only: the column stays small
    first = ~metrics["run_id"].duplicated()
    metrics["conditions"] = metrics["run_id"].map(runs.set_index("id")["conditions_json"]).where(first)
    metrics.insert(0, "run", "run-" + metrics.pop("run_id").astype(str))
    metrics = metrics[["run", "variant", "seed", "step", "key", "value", *cols[2:], "conditions"]]
    paths = [out / f"runs.{fmt}", out / f"metrics.{fmt}"]
    for frame, path in zip([runs, metrics], paths, strict=True):
        file_formats.write(frame, path, fmt)
    return paths


def read_import(path: Path) -> pd.DataFrame:
    """Read and check a metric file before anything is recorded (one clear line for what is wrong).

    A text file whose last line is cut is refused (:func:`attnres.tracking.file_formats.read`).
    """
    df = file_formats.read(path)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise AttnresError(f"{path} lacks column(s) {', '.join(missing)} (see `attnres import --help`)")
    # a seed by launch's rule (`--seeds`: attnres.config.SEED_RULE); a step any integer the INTEGER column holds
    for col, high in (("seed", SEED_MAX), ("step", INT_MAX)):
        numbers = pd.to_numeric(df[col], errors="coerce")
        bad = df.index[numbers.isna() | (numbers % 1 != 0) | (numbers < 0) | (numbers > high)]
        if len(bad):
            given = df[col].iloc[bad[0]]
            raise AttnresError(f"{path}: row {bad[0] + 1}: bad seed '{given}': {SEED_RULE}" if col == "seed" else
                               f"{path}: row {bad[0] + 1}: {col} '{given}' is not an integer from 0 to {high}")
        df[col] = numbers.astype("int64")
    values = pd.to_numeric(df["value"], errors="coerce")
    bad = df.index[~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))]
    if len(bad):
        raise AttnresError(f"{path}: row {bad[0] + 1}: value '{df['value'].iloc[bad[0]]}' is not a finite number")
    df["value"] = values.astype(float)
    keys = df["key"].astype(str)
    bad = df.index[keys.str.startswith(depth_keys.PREFIX) & ~keys.str.fullmatch(depth_keys.KEY.pattern)]
    if len(bad):
        raise AttnresError(f"{path}: row {bad[0] + 1}: key '{keys.iloc[bad[0]]}' is not a depth-map key "
                           "(depth:SITE:SOURCE, SOURCE up to 32 letters, digits or spaces)")
    df["key"] = [_depth_key(k) if k.startswith(depth_keys.PREFIX) else k for k in keys]  # depth:01:x is depth:1:x
    df["variant"] = [canonical(v) for v in df["variant"]]
    label = df["variant"] + "-s" + df["seed"].astype(str)  # a row with no run label is its variant's and seed's
    df["run"] = label if "run" not in df.columns else [d if pd.isna(v) else str(v) for v, d in zip(df["run"], label,
                                                                                                   strict=True)]
    df["status"] = df["status"].fillna(states.FINISHED) if "status" in df.columns else states.FINISHED
    bad = set(df["status"]) - set(states.STATES)
    if bad:
        raise AttnresError(f"{path}: unknown status {', '.join(sorted(map(str, bad)))}")
    if "total_steps" in df.columns:
        numbers = pd.to_numeric(df["total_steps"], errors="coerce")
        bad = df.index[numbers.notna() & ((numbers % 1 != 0) | (numbers < 1) | (numbers > INT_MAX))]
        if len(bad):
            raise AttnresError(f"{path}: row {bad[0] + 1}: total_steps '{df['total_steps'].iloc[bad[0]]}' is not "
                               f"an integer from 1 to {INT_MAX}")
        df["total_steps"] = numbers
    for col in ("preset", "experiment", "device", "message", "conditions"):
        if col in df.columns:
            df[col] = pd.Series([None if pd.isna(v) else str(v) for v in df[col]], index=df.index, dtype=object)
    for col in ("preset", "experiment"):  # names, as `attnres launch --experiment` takes them
        for i, name in zip(df.index, df[col] if col in df.columns else [], strict=False):
            if name is not None and not EXPERIMENT_NAME.fullmatch(name):
                raise AttnresError(f"{path}: row {i + 1}: {col} {name[:80]!r} is not a name: use 1 to 128 letters, "
                                   "digits, '.', '_' or '-', starting with a letter or digit")
    for i, text in zip(df.index, df["conditions"] if "conditions" in df.columns else [], strict=False):
        if text is not None and not _conditions_ok(text):
            raise AttnresError(f"{path}: row {i + 1}: conditions '{text[:80]}' is not a JSON list of objects "
                               "(what `attnres export` writes: device, world_size, threads, compile, dtype)")
    df = _scoped(path, df)
    _check_points(path, df)
    return df


def _depth_key(key: str) -> str:
    site, _, source = key[len(depth_keys.PREFIX):].partition(":")
    return depth_keys.key(int(site), source)


def _scoped(path: Path, df: pd.DataFrame) -> pd.DataFrame:
    """Each row's scope (preset, experiment, total_steps): given, else its run's (label, variant, seed) one where
    the run's other rows give exactly one, else the default (preset ``imported``, experiment: the preset)."""
    base = ["run", "variant", "seed"]
    for col in SCOPE:
        if col not in df.columns:
            df[col] = None if col != "total_steps" else np.nan
            continue
        given = df.groupby(base, sort=False)[col]
        missing = df[col].isna()
        bad = df.index[missing & (given.transform("nunique") > 1)]
        if len(bad):
            raise AttnresError(f"{path}: row {bad[0] + 1}: no {col}, and the other rows of run {df['run'][bad[0]]!r} "
                               f"give several: give this row its {col}")
        df[col] = df[col].where(~missing, given.transform("first"))
    df["preset"] = [DEFAULT_PRESET if p is None or p != p else p for p in df["preset"]]
    df["experiment"] = [p if e is None or e != e else e for e, p in zip(df["experiment"], df["preset"], strict=True)]
    return df


def _check_points(path: Path, df: pd.DataFrame) -> None:
    """A point (run, key, step) given twice must hold one value: the same value is recorded once, another value
    is an error naming the row (which of the two is right is not known)."""
    cols = [*IDENTITY, "key", "step"]
    again = df.duplicated(cols, keep=False)
    if not again.any():
        return
    seen: dict[tuple, tuple[int, float]] = {}
    sub = df[again]
    for i, value, *point in zip(sub.index, sub["value"], *(sub[c] for c in cols), strict=True):
        first = seen.setdefault(tuple(None if isinstance(x, float) and math.isnan(x) else x for x in point),
                                (i, value))
        if first[1] != value:
            raise AttnresError(f"{path}: row {i + 1}: {point[-2]} at step {point[-1]} of run {point[0]!r} is {value}, "
                               f"but row {first[0] + 1} gives {first[1]}: a point has one value")


def _conditions_ok(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, list) and all(isinstance(x, dict) for x in value)


def _given(grp: pd.DataFrame, col: str) -> object:
    """A run's value of an optional column (its first non-empty one), or None."""
    if col not in grp.columns:
        return None
    values = grp[col].dropna()
    return values.iloc[0] if len(values) else None


def _stage_order(value: object) -> tuple[int, float, str]:
    """Launch values in their order: none first, numbers by value (``9`` before ``10``), then text."""
    if value is None:
        return (0, 0.0, "")
    try:
        return (1, float(str(value)), "")
    except ValueError:
        return (2, 0.0, str(value))


def _budgets(df: pd.DataFrame) -> dict[str, int]:
    """Per preset, the largest last step of the file's finished runs: an unfinished run's likely budget."""
    done = df[df["status"] == states.FINISHED]
    return {str(p): int(g.max()) for p, g in done["step"].groupby(done["preset"])}


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _incoming(path: Path, ident: tuple, grp: pd.DataFrame, budgets: dict[str, int]) -> import_record.Incoming:
    """One run of the file as :func:`attnres.tracking.import_record.record` takes it."""
    label, variant, seed, preset, experiment, given = ident
    given = None if pd.isna(given) else int(given)
    status, last = str(grp["status"].iloc[-1]), int(grp["step"].max())
    budget = given if given is not None else last if status == states.FINISHED else max(last, budgets.get(preset, last))
    when = run_rows.now()
    columns = dict(
        variant=variant, seed=int(seed), preset=preset, experiment=experiment, device=_given(grp, "device"),
        message=_given(grp, "message"), data=f"imported:{path.name}",
        config_hash=_hash(json.dumps(["import", label, variant, int(seed), experiment, preset, given])),
        config_json=json.dumps({"variant": variant, "seed": int(seed), "imported": str(label)}),
        total_steps=budget, step=last, created_at=when, backend=IMPORTED, world_size=1,
        ended_at=None if status in states.ACTIVE else when, conditions_json=_given(grp, "conditions"),
        stop_step=last if status not in (*states.ACTIVE, states.FINISHED) else None)
    rows = list(zip(grp.index + 1, grp["step"].astype(int), grp["key"], grp["value"].astype(float), strict=True))
    return import_record.Incoming(
        ident=str(columns["config_hash"]), legacy=_hash(f"import:{label}:{variant}:{seed}"), status=status,
        scope={"experiment": experiment, "preset": preset, "total_steps": given}, columns=columns,
        stage=_given(grp, "launch"), rows=rows)


def import_file(engine: Engine, path: Path, df: pd.DataFrame | None = None) -> dict[str, int]:
    """Record the runs of a metric file (read by :func:`read_import`) in one transaction; returns runs created,
    points written (``rows``: what the database holds now that it did not), points it held already with the
    same value (``known``) and rows that repeated a point of the file (``repeated``, recorded once)."""
    df = read_import(path) if df is None else df
    repeated = df.duplicated([*IDENTITY, "key", "step"])
    df = df[~repeated]
    budgets = _budgets(df)
    incoming = [_incoming(path, ident, grp, budgets)
                for ident, grp in df.groupby(IDENTITY, sort=True, dropna=False)]
    try:
        got = import_record.record(engine, incoming, _stage_order)
    except import_record.Conflict as c:
        raise AttnresError(f"{path}: row {c.row}: {c.key} at step {c.step} is {c.value}, but the database holds "
                           f"{c.stored} (run {c.run_id}): nothing was imported") from None
    return {"runs_created": got.created, "rows": got.stored, "known": got.known, "repeated": int(repeated.sum())}


def imported_text(counts: dict[str, int]) -> str:
    """What an import did in one line: the rows it wrote are the rows the database gained."""
    held = [f"{counts['known']:,} already recorded"] if counts.get("known") else []
    held += [f"{counts['repeated']:,} repeated in the file, recorded once"] if counts.get("repeated") else []
    return (f"imported {counts['rows']:,} metric rows; {counts['runs_created']} new run(s)"
            + (f" ({'; '.join(held)})" if held else ""))
