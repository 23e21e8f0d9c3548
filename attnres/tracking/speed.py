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

from attnres.tracking import run_rows
from attnres.tracking.schema import Benchmark

if TYPE_CHECKING:
    import pandas as pd

def record_bench(engine: Engine, rows: Sequence[Mapping[str, Any]], device: str, threads: int, dtype: str,
                 preset: str, overrides: Sequence[str], steps: int) -> int:
    """Store one ``attnres bench`` session (one row per variant, standard first); returns its number."""
    now = run_rows.now()
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
