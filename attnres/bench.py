"""Benchmarks run side by side in one process, reported as ratios (never asserted by tests)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy import insert

from attnres.data.corpus import builtin_documents
from attnres.data.prepare import Source, prepare
from attnres.data.tokenizer import get_encoding
from attnres.errors import AttnresError


def bench_data(megabytes: float = 8.0, threads: int | None = None) -> dict[str, float]:
    """Prepare throughput (MB/s of UTF-8 text) next to tiktoken's own encode_ordinary_batch."""
    import os

    threads = threads or max(1, os.cpu_count() or 1)
    base = [d.text for d in builtin_documents()]
    texts, size, i = [], 0, 0
    while size < megabytes * 1e6:
        t = base[i % len(base)]
        texts.append(t)
        size += len(t.encode())
        i += 1
    enc = get_encoding()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "docs.jsonl"
        with src.open("w") as fh:
            for n, t in enumerate(texts):
                fh.write(json.dumps({"id": f"doc{n}", "text": t}) + "\n")
        enc.encode_ordinary_batch(texts[:64], num_threads=threads)  # warm up
        t0 = time.perf_counter()
        enc.encode_ordinary_batch(texts, num_threads=threads)
        t_tik = time.perf_counter() - t0
        t0 = time.perf_counter()
        summary = prepare(Source(kind="files", files=[str(src)]), Path(tmp) / "out", threads=threads)
        t_prep = time.perf_counter() - t0
    mb = size / 1e6
    return {"megabytes": mb, "documents": len(texts), "tokens": sum(summary.tokens.values()),
            "threads": threads, "tiktoken_mb_s": mb / t_tik, "prepare_mb_s": mb / t_prep,
            "ratio": (mb / t_prep) / (mb / t_tik)}


def synthetic_db(url: str, runs: int = 200, steps: int = 6000, variants: int = 10, seed: int = 0) -> int:
    """Fill a database with known curves: ``runs`` runs x ``steps`` steps x 5 metrics. Returns rows."""
    from attnres.tracking import store
    from attnres.tracking.db import get_engine
    from attnres.tracking.schema import Metric
    from attnres.variants import VARIANTS, resolve_run

    engine = get_engine(url)
    names = [n for n in VARIANTS if not n.startswith("deep")][:variants]
    rng = np.random.default_rng(seed)
    keys = store.key_ids(engine, ["train_loss", "eval_loss", "lr", "tokens_per_s", "peak_memory_bytes"])
    step = np.arange(1, steps + 1)
    total = 0
    for r in range(runs):
        variant = names[r % len(names)]
        cfg = resolve_run(variant, "tiny", 1000 + r // len(names), [f"steps={steps}"])
        run_id = store.create_run(engine, cfg, status="finished")
        store.update_run(engine, run_id, step=steps)
        offset = 0.01 * (r % len(names)) + rng.normal(0, 0.005)
        curves = {
            "train_loss": 3 + 7 * np.exp(-step / 500) + offset + rng.normal(0, 0.01, steps),
            "eval_loss": 3.05 + 7 * np.exp(-step / 500) + offset,
            "lr": np.full(steps, 1e-3),
            "tokens_per_s": np.full(steps, 1e5 * (1 - 0.02 * (r % len(names)))),
            "peak_memory_bytes": np.full(steps, 1e9 * (1 + 0.05 * (r % len(names)))),
        }
        with engine.begin() as conn:
            for name, values in curves.items():
                rows = [{"run_id": run_id, "key_id": keys[name], "step": int(s), "value": float(v)}
                        for s, v in zip(step, values, strict=True)]
                conn.execute(insert(Metric), rows)
                total += len(rows)
    return total


def bench_report(runs: int = 200, steps: int = 6000) -> dict[str, float]:
    """Time `attnres report` (without figures, then with) over a synthetic database."""
    if runs < 1 or steps < 1:
        raise AttnresError(f"--runs and --steps must be at least 1 (got {runs}, {steps})")
    from attnres.reporting import write_report
    from attnres.tracking.db import get_engine

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        t0 = time.perf_counter()
        rows = synthetic_db(url, runs, steps)
        t_fill = time.perf_counter() - t0
        engine = get_engine(url)
        t0 = time.perf_counter()
        write_report(engine, Path(tmp) / "report.md", plots=False)
        t_report = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_report(engine, Path(tmp) / "report.md", plots=True)
        t_plots = time.perf_counter() - t0
    return {"runs": runs, "steps": steps, "metric_rows": rows, "fill_rows_per_s": rows / t_fill,
            "report_s": t_report, "report_with_plots_s": t_plots}
