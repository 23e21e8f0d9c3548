"""Export runs and metrics to CSV/Parquet, and import runs recorded elsewhere.

The metric file format is shared by both directions, so an export imports back unchanged.
One row per metric point, long format:

    run      optional  label grouping rows into one run (default: "<variant>-s<seed>")
    variant  required  a variant name (or alias) of the registry
    seed     required  integer
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

Depth-attention maps travel as keys ``depth:SITE:SOURCE`` (see attnres.tracking.depth_maps).

Importing the same file twice records every point once: a run is identified by its label,
variant and seed, and metric rows are unique per (run, key, step).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from attnres import outputs
from attnres.errors import AttnresError
from attnres.tracking import depth_maps, launches, states, store
from attnres.variants import canonical

REQUIRED = ["variant", "seed", "step", "key", "value"]
IMPORTED = "imported"  # the backend of a run recorded elsewhere: no process here to watch or stop
INT_MAX = 2**31 - 1  # INTEGER in PostgreSQL


def export(engine: Engine, out: Path, fmt: str = "csv", experiment: str | None = None,
           preset: str | None = None) -> list[Path]:
    """Write ``runs.<fmt>`` and ``metrics.<fmt>`` (of one experiment or preset, or all) into folder
    ``out``; return their paths."""
    if fmt not in {"csv", "parquet"}:
        raise AttnresError(f"unknown export format '{fmt}'; choose csv or parquet")
    outputs.check(out, folder=True)
    runs = store.runs_frame(engine, experiment=experiment, preset=preset)
    if runs.empty and (experiment or preset):
        raise AttnresError("no runs match " + " and ".join(f"--{k} {v}" for k, v in
                                                           (("experiment", experiment), ("preset", preset)) if v))
    outputs.prepare(out, folder=True)
    metrics = store.all_metrics(engine, runs["id"].tolist())
    cols = ["variant", "seed", "status", "preset", "experiment", "total_steps", "device", "message", "launch"]
    metrics = metrics.join(runs.rename(columns={"launch_id": "launch"}).set_index("id")[cols], on="run_id")
    # a run's conditions (JSON, see attnres.tracking.speed) on its first row only: the column stays small
    first = ~metrics["run_id"].duplicated()
    metrics["conditions"] = metrics["run_id"].map(runs.set_index("id")["conditions_json"]).where(first)
    metrics.insert(0, "run", "run-" + metrics.pop("run_id").astype(str))
    metrics = metrics[["run", "variant", "seed", "step", "key", "value", *cols[2:], "conditions"]]
    paths = [out / f"runs.{fmt}", out / f"metrics.{fmt}"]
    for frame, path in zip([runs, metrics], paths, strict=True):
        frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
    return paths


def _read(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise AttnresError(f"no such file: {path}")
    try:
        if path.suffix == ".csv":
            return pd.read_csv(path)
        if path.suffix in {".jsonl", ".json"}:
            return pd.read_json(path, lines=True)
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
    except (ValueError, OSError) as exc:
        raise AttnresError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    raise AttnresError(f"unsupported file '{path}': expected .csv, .jsonl or .parquet")


def read_import(path: Path) -> pd.DataFrame:
    """Read and check a metric file before anything is recorded (one clear line for what is wrong)."""
    df = _read(path)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise AttnresError(f"{path} lacks column(s) {', '.join(missing)} (see `attnres import --help`)")
    for col, low in (("seed", -INT_MAX - 1), ("step", 0)):  # integers the database's INTEGER column holds
        numbers = pd.to_numeric(df[col], errors="coerce")
        bad = df.index[numbers.isna() | (numbers % 1 != 0) | (numbers < low) | (numbers > INT_MAX)]
        if len(bad):
            raise AttnresError(f"{path}: row {bad[0] + 1}: {col} '{df[col].iloc[bad[0]]}' is not an integer "
                               f"from {low} to {INT_MAX}")
        df[col] = numbers.astype("int64")
    values = pd.to_numeric(df["value"], errors="coerce")
    bad = df.index[~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))]
    if len(bad):
        raise AttnresError(f"{path}: row {bad[0] + 1}: value '{df['value'].iloc[bad[0]]}' is not a finite number")
    df["value"] = values.astype(float)
    keys = df["key"].astype(str)
    bad = df.index[keys.str.startswith(depth_maps.PREFIX) & ~keys.str.fullmatch(depth_maps.KEY.pattern)]
    if len(bad):
        raise AttnresError(f"{path}: row {bad[0] + 1}: key '{keys.iloc[bad[0]]}' is not a depth-map key "
                           "(depth:SITE:SOURCE, SOURCE up to 32 letters, digits or spaces)")
    df["variant"] = [canonical(v) for v in df["variant"]]
    if "run" not in df.columns:
        df["run"] = df["variant"] + "-s" + df["seed"].astype(str)
    df["status"] = df["status"].fillna(states.FINISHED) if "status" in df.columns else states.FINISHED
    bad = set(df["status"]) - set(states.STATES)
    if bad:
        raise AttnresError(f"{path}: unknown status {', '.join(sorted(bad))}")
    if "total_steps" in df.columns:
        numbers = pd.to_numeric(df["total_steps"], errors="coerce")
        bad = df.index[numbers.notna() & ((numbers % 1 != 0) | (numbers < 1) | (numbers > INT_MAX))]
        if len(bad):
            raise AttnresError(f"{path}: row {bad[0] + 1}: total_steps '{df['total_steps'].iloc[bad[0]]}' is not "
                               f"an integer from 1 to {INT_MAX}")
        df["total_steps"] = numbers
    for col in ("preset", "experiment", "device", "message", "conditions"):
        if col in df.columns:
            df[col] = [None if pd.isna(v) else str(v) for v in df[col]]
    for i, text in enumerate(df["conditions"] if "conditions" in df.columns else []):
        if text is not None and not _conditions_ok(text):
            raise AttnresError(f"{path}: row {i + 1}: conditions '{text[:80]}' is not a JSON list of objects "
                               "(what `attnres export` writes: device, world_size, threads, compile, dtype)")
    return df


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
    preset = done["preset"].fillna("imported") if "preset" in done.columns else pd.Series("imported", done.index)
    return {str(p): int(g.max()) for p, g in done["step"].groupby(preset)}


def import_file(engine: Engine, path: Path, df: pd.DataFrame | None = None) -> dict[str, int]:
    """Record the runs of a metric file (read by :func:`read_import`); returns runs created and rows given."""
    df = read_import(path) if df is None else df
    budgets = _budgets(df)
    created = 0
    groups = [(label, variant, seed, grp, hashlib.sha256(f"import:{label}:{variant}:{seed}".encode()).hexdigest()[:12])
              for (label, variant, seed), grp in df.groupby(["run", "variant", "seed"], sort=True)]
    known = {ident: store.run_with_hash(engine, ident) for *_, ident in groups}
    # the file's stages (its launch column; without one, the file is one stage), recorded in the order of
    # their launch values, so that a later stage stays later (a look is counted per stage, in order)
    given = {_given(grp, "launch") for *_, grp, ident in groups if known[ident] is None}
    stages = {g: launches.create(engine, launches.IMPORT) for g in sorted(given, key=_stage_order)}
    for label, variant, seed, grp, ident in groups:
        run_id = known[ident]
        if run_id is None:
            preset = str(_given(grp, "preset") or "imported")
            status, last = str(grp["status"].iloc[-1]), int(grp["step"].max())
            budget = _given(grp, "total_steps")
            budget = int(budget) if budget is not None else last if status == states.FINISHED else \
                max(last, budgets.get(preset, last))
            run_id = states.create(
                engine, states.IMPORTER, status, variant=variant, seed=int(seed), preset=preset,
                experiment=str(_given(grp, "experiment") or preset), device=_given(grp, "device"),
                message=_given(grp, "message"), data=f"imported:{path.name}", config_hash=ident,
                config_json=json.dumps({"variant": variant, "seed": int(seed), "imported": str(label)}),
                total_steps=budget, step=last, created_at=store.now(), backend=IMPORTED,
                ended_at=None if status in states.ACTIVE else store.now(), world_size=1,
                stop_step=last if status not in (*states.ACTIVE, states.FINISHED) else None,
                launch_id=stages[_given(grp, "launch")], conditions_json=_given(grp, "conditions"))
            created += 1
        store.log_metrics(engine, run_id, list(zip(grp["step"], grp["key"], grp["value"], strict=True)))
        store.summarize(engine, run_id)
    return {"runs_created": created, "rows": len(df)}
