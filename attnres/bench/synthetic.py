"""A synthetic database of known curves, for timing reports and status at scale."""

from __future__ import annotations

import numpy as np


def synthetic_db(url: str, runs: int = 200, steps: int = 6000, variants: int = 10, seed: int = 0) -> int:
    """Fill a database with known curves: ``runs`` runs x ``steps`` steps x 5 metrics, and each run's eval at step 0
    (complete runs, as `attnres status` checks them). Returns rows."""
    from attnres.tracking import states
    from attnres.tracking.run_store import RunStore
    from attnres.variants.registry import VARIANTS, resolve_run

    store = RunStore(url)
    names = [n for n in VARIANTS if not n.startswith("deep")][:variants]
    rng = np.random.default_rng(seed)
    step = np.arange(1, steps + 1)
    total = 0
    for r in range(runs):
        variant = names[r % len(names)]
        cfg = resolve_run(variant, "tiny", 1000 + r // len(names), [f"steps={steps}"])
        run_id = store.create_run(cfg, actor=states.IMPORTER, status=states.FINISHED)
        store.update_run(run_id, step=steps)
        offset = 0.01 * (r % len(names)) + rng.normal(0, 0.005)
        curves = {
            "train_loss": 3 + 7 * np.exp(-step / 500) + offset + rng.normal(0, 0.01, steps),
            "eval_loss": 3.05 + 7 * np.exp(-step / 500) + offset,
            "lr": np.full(steps, 1e-3),
            "tokens_per_s": np.full(steps, 1e5 * (1 - 0.02 * (r % len(names)))),
            "peak_memory_bytes": np.full(steps, 1e9 * (1 + 0.05 * (r % len(names)))),
        }
        rows = [(int(s), name, float(v)) for name, values in curves.items() for s, v in zip(step, values, strict=True)]
        rows.append((0, "eval_loss", 10.05 + offset))  # the initialisation's eval, as a run records it: a whole curve
        total += store.log_metrics(run_id, rows)
        store.summarize(run_id)  # as a run's end does
    return total
