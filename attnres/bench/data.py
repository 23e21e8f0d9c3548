"""``attnres bench data``: data preparation beside tiktoken's own batch encoder, in one process."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from attnres.data.corpus import builtin_documents
from attnres.data.prepare import Source, prepare
from attnres.data.tokenizer import get_encoding
from attnres.errors import AttnresError


def bench_data(megabytes: float = 8.0, threads: int | None = None) -> dict[str, float]:
    """Prepare throughput (MB/s of UTF-8 text) next to tiktoken's own encode_ordinary_batch."""
    import math
    import os

    if not (math.isfinite(megabytes) and 0 < megabytes <= 10_000):
        raise AttnresError(f"--megabytes {megabytes}: give a size between 0 and 10000")
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
        scaling = {}
        for n in sorted({1, threads}):  # processes over batches, one thread each: how it scales with cores
            t0 = time.perf_counter()
            prepare(Source(kind="files", files=[str(src)]), Path(tmp) / f"workers-{n}", threads=1, workers=n)
            scaling[n] = time.perf_counter() - t0
    mb = size / 1e6
    return {"megabytes": mb, "documents": len(texts), "tokens": sum(summary.tokens.values()),
            "threads": threads, "tiktoken_mb_s": mb / t_tik, "prepare_mb_s": mb / t_prep,
            "ratio": (mb / t_prep) / (mb / t_tik),
            **{f"workers_{n}_mb_s": mb / t for n, t in scaling.items()},
            "workers_speedup": scaling[1] / scaling[max(scaling)]}
