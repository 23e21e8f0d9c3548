"""Cost figures from like with like: a variant's speed and memory against the baseline, divided only where
both were measured under the same conditions, else taken from a paired bench. Pure: DataFrames in.

A run's tokens/s depends on the machine as much as on its variant (:mod:`attnres.tracking.speed`): the
device model, world size, compute threads, compilation and dtype. Two arms' recorded throughputs are
divided only when every run of both recorded the same of these; peak memory only when they agree on
all but the threads. Otherwise the figure comes from the newest ``attnres bench`` session stored for the
scope's preset on the arms' device, which timed both variants step by step in one process; without one,
the cell says what differs and no figure is made up.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass

import pandas as pd

from attnres.tracking.speed import CONDITIONS


@dataclass
class Cost:
    """One variant's cost against the baseline: % change in tok/s and in peak memory, and where each is from."""

    speed: float = math.nan
    memory: float = math.nan
    speed_from: str = ""  # "" (the runs' own figures), "bench N, DATE" or why there is none
    memory_from: str = ""
    bench: int | None = None  # the bench session a figure came from


def condition_sets(conditions_json: object) -> list[dict]:
    return json.loads(conditions_json) if isinstance(conditions_json, str) and conditions_json else []


def _key(sets: list[dict], fields: tuple[str, ...]) -> str:
    """One run's conditions on ``fields`` (every attempt's), as a comparable key; "" when not recorded."""
    return json.dumps(sorted({json.dumps({f: s.get(f) for f in fields}, sort_keys=True) for s in sets}))


def _values(sets_of: list[list[dict]], field: str) -> str:
    vals = sorted({"not recorded" if s.get(field) is None else str(s.get(field)) for sets in sets_of for s in sets}
                  or {"not recorded"})
    return ", ".join(vals)


def differences(a: list[list[dict]], b: list[list[dict]], fields: tuple[str, ...]) -> str:
    """What differs between two arms' runs, e.g. 'threads 1, 2 vs 1' (a run's attempts count as its own)."""
    out = []
    for f in fields:
        va, vb = _values(a, f), _values(b, f)
        if va != vb or "," in va:
            out.append(f"{f.replace('_', ' ')} {va} vs {vb}")
    if not out and any(not s for s in a + b) and not all(not s for s in a + b):
        out.append("conditions recorded for some runs only")
    return "; ".join(out)


def alike(a: list[list[dict]], b: list[list[dict]], fields: tuple[str, ...]) -> bool:
    return len({_key(s, fields) for s in a + b}) == 1


def unrecorded(a: list[list[dict]]) -> bool:
    """No run here recorded its conditions (imported, or trained before they were recorded)."""
    return not any(a)


def fields_for(a: list[list[dict]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The conditions that matter for these runs' speed and for their memory: on GPUs the CPU threads hardly
    change a step's speed, and threads never change what a step holds."""
    devices = [str(s.get("device")) for sets in a for s in sets if s.get("device")]
    gpus = bool(devices) and not any(d.startswith("cpu") for d in devices)
    memory = tuple(f for f in CONDITIONS if f != "threads")
    return (memory if gpus else CONDITIONS), memory


def device(a: list[list[dict]]) -> str | None:
    """The device most of these runs trained on (None when none recorded one)."""
    seen = Counter(str(s["device"]) for sets in a for s in sets if s.get("device"))
    return seen.most_common(1)[0][0] if seen else None


def _bench(benches: pd.DataFrame, variant: str, baseline: str, on: str | None) -> pd.DataFrame | None:
    """The newest bench session on device ``on`` holding both variants (its rows of the two), or None."""
    if on is None or benches.empty:
        return None
    mine = benches[(benches["device"] == on) & benches["variant"].isin([variant, baseline])]
    for session in sorted(set(mine["session"]), reverse=True):
        rows = mine[mine["session"] == session].set_index("variant")
        if {variant, baseline} <= set(rows.index):
            return rows
    return None


def cost(variant: str, baseline: str, table: pd.DataFrame, runs: pd.DataFrame, benches: pd.DataFrame) -> Cost:
    """``variant``'s speed and memory change against ``baseline`` from like with like (see the module)."""
    rows = table.set_index("variant")
    by_id = runs.set_index("id")["conditions_json"] if "conditions_json" in runs else pd.Series(dtype=object)

    def sets(v: str) -> list[list[dict]]:
        return [condition_sets(by_id.get(int(r))) for r in rows.at[v, "run_ids"].values()]

    a, b = sets(variant), sets(baseline)
    speed_fields, memory_fields = fields_for(a + b)
    same_speed, same_memory = alike(a, b, speed_fields), alike(a, b, memory_fields)
    blind = "conditions not recorded" if unrecorded(a + b) else ""
    out = Cost(speed_from=blind, memory_from=blind)
    if same_speed:
        out.speed = (rows.at[variant, "tokens_per_s"] / rows.at[baseline, "tokens_per_s"] - 1) * 100
    if same_memory:
        out.memory = (rows.at[variant, "peak_memory_bytes"] / rows.at[baseline, "peak_memory_bytes"] - 1) * 100
    if same_speed and same_memory:
        return out
    found = _bench(benches, variant, baseline, device(a + b))
    named = ""
    if found is not None:
        out.bench = int(found["session"].iloc[0])
        named = f"bench {out.bench}, {pd.Timestamp(found['created_at'].iloc[0]).date().isoformat()}"
    if not same_speed:
        if found is not None:
            out.speed = (found.at[variant, "speed_ratio"] / found.at[baseline, "speed_ratio"] - 1) * 100
            out.speed_from = named
        else:
            out.speed_from = "not comparable: " + differences(a, b, speed_fields)
    if not same_memory:
        peak = found["peak_memory_bytes"] if found is not None else None
        if peak is not None and peak.notna().all():
            out.memory = (peak[variant] / peak[baseline] - 1) * 100
            out.memory_from = named
        else:
            out.memory_from = "not comparable: " + differences(a, b, memory_fields)
    return out


def cell(value: float, source: str) -> str:
    """'-46%', '-46% (bench 3, 2026-12-05)' or 'not comparable: threads 1, 2 vs 1'."""
    if source.startswith("not comparable"):
        return source
    if not math.isfinite(value):
        return "—"
    return f"{value:+.0f}%" + (f" ({source})" if source else "")


def conditions_text(sets: list[dict]) -> str:
    """'cpu: Intel Xeon x 1, 2 threads, float32, not compiled'."""
    return "; ".join(f"{s.get('device')} x {s.get('world_size')}, {s.get('threads')} thread(s), {s.get('dtype')}, "
                     + ("compiled" if s.get("compile") else "not compiled") for s in sets)


def note(costs: dict[str, Cost], runs: pd.DataFrame, benches: pd.DataFrame, baseline: str, preset: str,
         bench_args: list[str] | None = None) -> str:
    """What the cost figures rest on: the runs' conditions, each bench used, and how to measure what is missing.
    ``bench_args`` are the ``--set`` items that give the runs' model (for the bench command it suggests)."""
    recorded = [s for c in runs.get("conditions_json", pd.Series(dtype=object)) for s in condition_sets(c)]
    distinct = {json.dumps(s, sort_keys=True): s for s in recorded}
    lines = ["Speed and memory are divided only between runs that recorded the same conditions (device model, "
             "world size, compute threads (on CPUs), compile, dtype; memory: all but the threads). Otherwise the "
             "cell says what differs, or gives the figure of an `attnres bench` session on the runs' device, named "
             "in the cell, which timed the variants step by step in one process."]
    blind = sorted(v for v, c in costs.items() if "conditions not recorded" in (c.speed_from, c.memory_from))
    if blind:
        lines.append(f"{', '.join(blind)} and {baseline}: their runs recorded no conditions (imported, or trained "
                     "before conditions were recorded), so their figures are divided as recorded, marked.")
    elif len(distinct) == 1:
        lines.append(f"Every run here: {conditions_text(list(distinct.values()))}.")
    used = sorted({c.bench for c in costs.values() if c.bench is not None})
    for session in used:
        b = benches[benches["session"] == session].iloc[0]
        made = pd.Timestamp(b["created_at"]).date().isoformat()
        via = "" if baseline == "standard" else f" ({baseline}'s figure and the variant's are each timed against " \
            "standard there; their ratio is given)"
        lines.append(f"Bench {session}: {made}, {b['device']}, {int(b['threads'])} thread(s), {b['dtype']}, not "
                     f"compiled, preset {b['preset']}, median of {int(b['steps'])} paired steps{via}.")
    missing = sorted(v for v, c in costs.items() if c.speed_from.startswith("not comparable"))
    if missing:
        named = " ".join(missing + ([] if baseline == "standard" else [baseline]))
        sets = "".join(f" --set {item}" for item in bench_args or [])
        lines.append(f"To measure the ones marked not comparable side by side on this machine: "
                     f"`attnres bench {named} --preset {preset}{sets}`.")
    return " ".join(lines)
