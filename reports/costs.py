"""Cost figures from like with like: a variant's speed and memory against the baseline, divided only where
both were measured under the same conditions, else taken from a paired bench. Pure: DataFrames in.

A run's tokens/s depends on the machine as much as on its variant (:mod:`attnres.tracking.speed`): the
device model, world size, compute threads, compilation and dtype. Two arms' recorded throughputs are
divided only when every run of both recorded the same of these; peak memory only when they agree on
all but the threads. Otherwise the figure comes from the newest ``attnres bench`` session stored for the
scope's preset on the arms' device, which timed both variants step by step in one process; without one,
the cell says what differs and no figure is made up.

Two arms' runs are not alike either when they trained under clearly different load from other processes
(:data:`LOAD_APART`, :data:`LOAD_HIGH`; runs that recorded none are judged by their conditions alone). A
figure from the runs carries their run-to-run spread (:func:`spread`): where it covers no change, the cell
says the figure is within run-to-run noise and points to ``attnres bench``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass

import pandas as pd
from scipy import stats

from attnres.conditions import CONDITIONS, LOAD, PROCESS

LOAD_APART, LOAD_HIGH = 0.25, 0.5  # others' CPU share (of the machine) that makes two arms' runs not alike
NOISE_LEVEL = 0.95
BENCH_HINT = "`attnres bench` measures it side by side"


@dataclass
class Cost:
    """One variant's cost against the baseline: % change in tok/s and in peak memory, and where each is from."""

    speed: float = math.nan
    memory: float = math.nan
    speed_from: str = ""  # the runs' spread (see noise()), "bench N, DATE" or why there is none
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


def run_load(sets: list[dict]) -> float | None:
    """Others' mean CPU share (0..1 of the machine) while this run trained, over the attempts that recorded it
    (weighted by their seconds); None when none did."""
    timed = [(float(s[LOAD]), float(s.get(LOAD + "_s") or 1.0)) for s in sets if s.get(LOAD) is not None]
    seconds = sum(w for _, w in timed)
    return sum(x * w for x, w in timed) / seconds if timed and seconds > 0 else None


def loads_apart(a: list[list[dict]], b: list[list[dict]]) -> str:
    """'load 0.05 vs 0.62 of the machine' when the two arms' runs trained under clearly different load from
    other processes (shares more than :data:`LOAD_APART` apart, or any above :data:`LOAD_HIGH`), else ''."""
    la = [x for x in map(run_load, a) if x is not None]
    lb = [x for x in map(run_load, b) if x is not None]
    both = la + lb
    if not both or (max(both) - min(both) <= LOAD_APART and max(both) <= LOAD_HIGH):
        return ""
    def shown(xs: list[float]) -> str:
        return ", ".join(sorted({f"{x:.2f}" for x in xs})) or "not recorded"
    return f"load {shown(la)} vs {shown(lb)} of the machine"


def speed_alike(a: list[list[dict]], b: list[list[dict]], fields: tuple[str, ...]) -> bool:
    """Whether two arms' tokens/s can be divided: the same conditions and no clearly different load."""
    return alike(a, b, fields) and not loads_apart(a, b)


def speed_differences(a: list[list[dict]], b: list[list[dict]], fields: tuple[str, ...]) -> str:
    """What makes two arms' tokens/s not comparable (conditions, then load)."""
    return "; ".join(x for x in (differences(a, b, fields), loads_apart(a, b)) if x)


def spread(a: list[float], b: list[float], level: float = NOISE_LEVEL) -> tuple[float, float] | None:
    """The interval of ``a``'s tokens/s against ``b``'s, as a % change: Welch's t interval of the difference in
    mean log tok/s, exponentiated. None when an arm has fewer than two runs (no spread is known)."""
    la, lb = ([math.log(x) for x in xs if math.isfinite(x) and x > 0] for xs in (a, b))
    if len(la) < 2 or len(lb) < 2:
        return None
    d = sum(la) / len(la) - sum(lb) / len(lb)
    va, vb = (statistics.variance(xs) / len(xs) for xs in (la, lb))
    se = math.sqrt(va + vb)
    if se == 0:
        return (math.exp(d) - 1) * 100, (math.exp(d) - 1) * 100
    df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
    t = float(stats.t.ppf(0.5 + level / 2, df))
    return (math.exp(d - t * se) - 1) * 100, (math.exp(d + t * se) - 1) * 100


def within_noise(source: str) -> bool:
    """Whether a speed cell's source says its figure is within run-to-run noise (:func:`noise`)."""
    return source.startswith("within run-to-run noise")


def noise(a: list[float], b: list[float], names: tuple[str, str] = ("", "")) -> str:
    """How far a speed figure from the runs' own tokens/s is from run-to-run noise, for its cell: '±5%', 'within
    run-to-run noise (±31%); `attnres bench` measures it side by side', or 'one run per arm: spread unknown'."""
    got = spread(a, b)
    if got is None:
        single = [n or "an arm" for n, xs in zip(names, (a, b), strict=True) if len(xs) < 2]
        return ("one run per arm" if len(single) == 2 else f"one run of {single[0]}") + ": spread unknown"
    half = f"±{(got[1] - got[0]) / 2:.0f}%"
    return f"within run-to-run noise ({half}); {BENCH_HINT}" if got[0] <= 0 <= got[1] else half


def unrecorded(a: list[list[dict]]) -> bool:
    """No run here recorded its conditions (imported, or trained before they were recorded)."""
    return not any(a)


def fields_for(a: list[list[dict]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The conditions that matter for these runs' speed and for their memory: on GPUs the CPU threads hardly
    change a step's speed, and threads never change what a step holds; how the trainer's process started
    changes no step's speed, and on a CPU it changes the peak memory (the whole process's resident set: a
    trainer forked from torchrun's agent, or trained in the launching process, holds what that process held),
    where a GPU's is the CUDA allocator's own."""
    devices = [str(s.get("device")) for sets in a for s in sets if s.get("device")]
    gpus = bool(devices) and not any(d.startswith("cpu") for d in devices)
    memory = tuple(f for f in CONDITIONS if f != "threads" and not (gpus and f == PROCESS))
    speed = tuple(f for f in (memory if gpus else CONDITIONS) if f != PROCESS)
    return speed, memory


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


def _change(mine: float, base: float) -> float:
    """``mine`` against ``base`` in %; NaN where the baseline's figure is 0 or missing (nothing to divide by)."""
    return (float(mine) / float(base) - 1) * 100 if math.isfinite(float(base)) and float(base) else math.nan


def cost(variant: str, baseline: str, table: pd.DataFrame, runs: pd.DataFrame, benches: pd.DataFrame) -> Cost:
    """``variant``'s speed and memory change against ``baseline`` from like with like (see the module)."""
    rows = table.set_index("variant")
    by_id = runs.set_index("id")["conditions_json"] if "conditions_json" in runs else pd.Series(dtype=object)
    tps = runs.set_index("id")["tokens_per_s"] if "tokens_per_s" in runs else pd.Series(dtype=float)

    def sets(v: str) -> list[list[dict]]:
        return [condition_sets(by_id.get(int(r))) for r in rows.at[v, "run_ids"].values()]

    def speeds(v: str) -> list[float]:
        return [float(x) for r in rows.at[v, "run_ids"].values() if pd.notna(x := tps.get(int(r)))]

    a, b = sets(variant), sets(baseline)
    speed_fields, memory_fields = fields_for(a + b)
    same_speed, same_memory = speed_alike(a, b, speed_fields), alike(a, b, memory_fields)
    blind = "conditions not recorded" if unrecorded(a + b) else ""
    out = Cost(speed_from=blind, memory_from=blind)
    if same_speed:
        out.speed = _change(rows.at[variant, "tokens_per_s"], rows.at[baseline, "tokens_per_s"])
        out.speed_from = "; ".join(x for x in (noise(speeds(variant), speeds(baseline), (variant, baseline)),
                                               blind) if x)
    if same_memory:
        out.memory = _change(rows.at[variant, "peak_memory_bytes"], rows.at[baseline, "peak_memory_bytes"])
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
            out.speed_from = "not comparable: " + speed_differences(a, b, speed_fields)
    if not same_memory:
        peak = found["peak_memory_bytes"] if found is not None else None
        if peak is not None and peak.notna().all():
            out.memory = (peak[variant] / peak[baseline] - 1) * 100
            out.memory_from = named
        else:
            out.memory_from = "not comparable: " + differences(a, b, memory_fields)
    return out


def cell(value: float, source: str) -> str:
    """'-46% (±5%)', '-46%: within run-to-run noise (±31%); ...', '-46% (bench 3, 2026-12-05)' or 'not
    comparable: threads 1, 2 vs 1'."""
    if source.startswith("not comparable"):
        return source
    if not math.isfinite(value):
        return "—"
    if within_noise(source):
        return f"{value:+.0f}%: {source}"
    return f"{value:+.0f}%" + (f" ({source})" if source else "")


def conditions_text(sets: list[dict]) -> str:
    """'cpu: Intel Xeon x 1, 2 threads, float32, not compiled'."""
    return "; ".join(f"{s.get('device')} x {s.get('world_size')}, {s.get('threads')} thread(s), {s.get('dtype')}, "
                     + ("compiled" if s.get("compile") else "not compiled")
                     + (f", trainer process: {s[PROCESS]}" if s.get(PROCESS) else "") for s in sets)


def note(costs: dict[str, Cost], runs: pd.DataFrame, benches: pd.DataFrame, baseline: str, preset: str,
         bench_args: list[str] | None = None) -> str:
    """What the cost figures rest on: the runs' conditions, each bench used, and how to measure what is missing.
    ``bench_args`` are the ``--set`` items that give the runs' model (for the bench command it suggests)."""
    recorded = [s for c in runs.get("conditions_json", pd.Series(dtype=object)) for s in condition_sets(c)]
    distinct = {json.dumps(s, sort_keys=True): s for s in ({f: x.get(f) for f in CONDITIONS} for x in recorded)}
    lines = ["Speed and memory are divided only between runs that recorded the same conditions (device model, "
             "world size, compute threads (on CPUs), compile, dtype; memory: all but the threads, and on CPUs how the "
             "trainer's process started, as its peak memory is the whole process's), and speed only "
             f"between runs under alike load (other processes' CPU share within {LOAD_APART:.2f} of the machine, "
             f"none above {LOAD_HIGH:.2f}, where recorded). Otherwise the cell says what differs, or gives the figure "
             "of an `attnres bench` session on the runs' device, named in the cell, which timed the variants step "
             "by step in one process. A speed figure from the runs gives their run-to-run spread: ±N% is half the "
             f"{NOISE_LEVEL:.0%} interval of the change (Welch's t on the runs' log tok/s); where that interval "
             "covers no change the cell says it is within run-to-run noise, and with one run in an arm the spread "
             "is unknown. Either way `attnres bench` measures the variants side by side in one process."]
    blind = sorted(v for v, c in costs.items() if "conditions not recorded" in c.speed_from + c.memory_from)
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
    missing = sorted(v for v, c in costs.items()
                     if c.speed_from.startswith("not comparable") or within_noise(c.speed_from))
    if missing:
        named = " ".join(missing + ([] if baseline == "standard" else [baseline]))
        sets = "".join(f" --set {item}" for item in bench_args or [])
        lines.append("To measure the ones marked not comparable or within run-to-run noise side by side on this "
                     "machine: "
                     f"`attnres bench {named} --preset {preset}{sets}`.")
    return " ".join(lines)
