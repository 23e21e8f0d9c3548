"""What a run's speed depends on, and the paired speed measurements of ``attnres bench``.

A tokens/s figure measures a variant on a machine: the device model, the compute threads per process,
the world size, compilation and the autocast dtype all change it (on one busy CPU the same variant
recorded 200 tok/s with two threads and 4,000 with one). A run records those *conditions* with each
attempt, and a report divides throughputs only where every run it compares recorded the same ones; the
rest of its cost figures come from a bench session stored here (migration 0008).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, func, insert, select

from attnres.tracking import store
from attnres.tracking.schema import Benchmark

if TYPE_CHECKING:
    import pandas as pd

#: What a throughput depends on, in the order a report names them; and how the trainer's process started
#: (:data:`PROCESS`), which a CPU's peak memory depends on (it counts the whole process) and no throughput does.
PROCESS = "process"
CONDITIONS = ("device", "world_size", "threads", "compile", "dtype", PROCESS)


UNKNOWN: dict[str, Any] = dict.fromkeys(CONDITIONS)  # an attempt that recorded none (before migration 0008)

#: Beside a set's conditions, once its attempt ended: other processes' mean share of the machine's CPU while it
#: trained (0..1, :class:`attnres.training.recorder.LoadSampler`), and over how many seconds (``load_s``).
LOAD = "load"


def merged(recorded: str | None, now: Mapping[str, Any], trained_before: bool = False) -> str:
    """A run's ``conditions_json`` once an attempt under ``now`` joins it: the list of distinct sets. A run
    that had trained (``trained_before``) without recording any keeps an unknown set for those steps."""
    sets = json.loads(recorded) if recorded else ([UNKNOWN] if trained_before else [])
    entry = {k: now.get(k) for k in CONDITIONS}
    if entry not in [{k: s.get(k) for k in CONDITIONS} for s in sets]:  # (a set's load is no condition)
        sets.append(entry)
    return json.dumps(sets, sort_keys=True)


def with_load(recorded: str, now: Mapping[str, Any], share: float, seconds: float) -> str:
    """``recorded`` (a run's ``conditions_json``) with an attempt's load, ``share`` of the machine over
    ``seconds``, joined to the set of its conditions ``now`` (averaged by seconds with an earlier attempt's)."""
    sets = json.loads(recorded) if recorded else []
    entry = {k: now.get(k) for k in CONDITIONS}
    for s in sets:
        if {k: s.get(k) for k in CONDITIONS} == entry and seconds > 0:
            before = float(s.get(LOAD + "_s") or 0.0) if s.get(LOAD) is not None else 0.0
            total = before + seconds
            mean = ((float(s[LOAD]) * before if before else 0.0) + share * seconds) / total
            s[LOAD], s[LOAD + "_s"] = round(mean, 4), round(total, 1)
    return json.dumps(sets, sort_keys=True)


def record_bench(engine: Engine, rows: Sequence[Mapping[str, Any]], device: str, threads: int, dtype: str,
                 preset: str, overrides: Sequence[str], steps: int) -> int:
    """Store one ``attnres bench`` session (one row per variant, standard first); returns its number."""
    now = store.now()
    with engine.begin() as conn:
        session = int(conn.execute(select(func.coalesce(func.max(Benchmark.session), 0))).scalar()) + 1
        conn.execute(insert(Benchmark), [{
            "session": session, "created_at": now, "device": device, "threads": threads, "dtype": dtype,
            "preset": preset, "overrides_json": json.dumps(list(overrides)), "variant": r["variant"],
            "n_layer": r["n_layer"], "d_model": r["d_model"], "model_json": json.dumps(r["model"], sort_keys=True),
            "steps": steps, "tokens_per_s": r["tokens_per_s"],
            "speed_ratio": r["speed_ratio"], "speed_ratio_q1": r["speed_ratio_q1"],
            "speed_ratio_q3": r["speed_ratio_q3"], "peak_memory_bytes": r["peak_memory_bytes"],
            "saved_ratio": r["saved_ratio"]} for r in rows])
    return session


BENCH_COLUMNS = ["session", "created_at", "device", "threads", "dtype", "preset", "overrides_json", "variant",
                 "n_layer", "d_model", "model_json", "steps", "tokens_per_s", "speed_ratio", "speed_ratio_q1",
                 "speed_ratio_q3", "peak_memory_bytes", "saved_ratio"]


def benchmarks(engine: Engine, preset: str | None = None) -> pd.DataFrame:
    """Every stored bench row (of ``preset``), oldest session first."""
    q = select(*[getattr(Benchmark, c) for c in BENCH_COLUMNS]).order_by(Benchmark.session, Benchmark.id)
    if preset is not None:
        q = q.where(Benchmark.preset == preset)
    import pandas as pd  # (a report's: the trainer records its conditions without pandas)

    with engine.connect() as conn:
        return pd.DataFrame([tuple(r) for r in conn.execute(q).all()], columns=BENCH_COLUMNS)
