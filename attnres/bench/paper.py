"""A database the size of the results document's study, for ``attnres bench tracker``'s paper-scale measure.

The document's study at paper scale: 15 variants x 5 seeds x 6,000 steps at ``paper500m``, training metrics
every 10 steps (the trainer's five: train loss, learning rate, gradient norm, tokens/s, peak memory), an eval
at step 0 and every 250 steps, and each AttnRes variant's depth-attention map at each eval. The maps have the
shape the real residual module gives them: each variant's own module is built at the preset's depth (at a
small width, which the map's sites and sources do not depend on) and tallied over one forward pass, so a
full-AttnRes map has its O(L²) entries and a block map its blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

PRESET = "paper500m"
VARIANTS = 15
SEEDS = (42, 1337, 123, 456, 789)
STEPS = 6000
TRAIN_EVERY = 10
EVAL_EVERY = 250


def depth_keys(variant: str, preset: str = PRESET) -> list[str]:
    """The depth-map keys (``depth:SITE:SOURCE``) a run of ``variant`` at ``preset`` records at an eval; none
    for a variant without depth attention."""
    import torch

    from attnres.depth_keys import key
    from attnres.model.residual import build_residual
    from attnres.variants.registry import resolve_run

    model = resolve_run(variant, preset, 1).model
    width = 16
    residual = build_residual(model.residual, width, model.depth_steps, model.norm_eps)
    if not hasattr(residual, "tally_maps"):
        return []
    residual.tally_maps()
    with torch.no_grad():
        residual(torch.randn(1, 2, width), [torch.tanh] * model.depth_steps)
    return [key(site, source) for site, source in sorted(residual.depth_map())]


def paper_db(url: str, variants: int = VARIANTS, seeds: tuple[int, ...] = SEEDS, steps: int = STEPS,
             progress: Callable[[str], None] = lambda _: None, seed: int = 0) -> dict[str, int]:
    """Fill the database at ``url`` with the study: ``variants`` (the registry's first, in its order) x ``seeds``,
    finished at ``steps``. Returns the runs, metric rows and depth-map rows written."""
    from attnres.tracking import states
    from attnres.tracking.run_store import RunStore
    from attnres.variants.registry import VARIANTS as REGISTRY
    from attnres.variants.registry import resolve_run

    names = list(REGISTRY)[:variants]
    rng = np.random.default_rng(seed)
    train_steps = np.union1d(np.arange(TRAIN_EVERY, steps + 1, TRAIN_EVERY), [steps])  # and the last, as a run
    eval_steps = np.union1d(np.arange(0, steps + 1, EVAL_EVERY), [steps])  # from step 0 to the last, as a run
    store = RunStore(url)
    out = {"paper_runs": 0, "paper_metric_rows": 0, "paper_depth_rows": 0}
    try:
        for v, variant in enumerate(names):
            keys = depth_keys(variant)
            progress(f"paper scale: {variant} ({v + 1}/{len(names)}), {len(seeds)} seeds")
            for seed_ in seeds:
                cfg = resolve_run(variant, PRESET, seed_, [f"steps={steps}", f"log_every={TRAIN_EVERY}",
                                                           f"eval_every={EVAL_EVERY}"])
                run_id = store.create_run(cfg, actor=states.IMPORTER, status=states.FINISHED)
                store.update_run(run_id, step=steps)
                offset = 0.01 * v + rng.normal(0, 0.005)
                curve = 2.6 + 8 * np.exp(-train_steps / 600) + offset
                train = {"train_loss": curve + rng.normal(0, 0.02, len(train_steps)),
                         "lr": 6e-4 * np.minimum(1, train_steps / 500),
                         "grad_norm": 0.3 + rng.gamma(2, 0.05, len(train_steps)),
                         "tokens_per_s": 2.5e5 * (1 - 0.03 * v) + rng.normal(0, 2e3, len(train_steps)),
                         "peak_memory_bytes": np.full(len(train_steps), 4e10 * (1 + 0.02 * v))}
                rows = [(int(s), k, float(x)) for k, values in train.items() for s, x in zip(train_steps, values,
                                                                                            strict=True)]
                evals = 2.65 + 8 * np.exp(-eval_steps / 600) + offset + rng.normal(0, 0.003, len(eval_steps))
                rows += [(int(s), "eval_loss", float(x)) for s, x in zip(eval_steps, evals, strict=True)]
                weights = rng.dirichlet(np.ones(8), size=len(keys) * len(eval_steps)).max(axis=1) if keys else []
                rows += [(int(s), k, float(w)) for (s, k), w in zip(((s, k) for s in eval_steps for k in keys),
                                                                    weights, strict=True)]
                store.log_metrics(run_id, rows)
                store.summarize(run_id)  # as a run's end does
                out["paper_runs"] += 1
                out["paper_depth_rows"] += len(keys) * len(eval_steps)
                out["paper_metric_rows"] += len(rows) - len(keys) * len(eval_steps)
    finally:
        store.close()
    return out
