"""The seed document's situation (../shared/seed/attnres-results.md) as an import file.

Its figures at step 6000 (and the deep comparison at 2500), with eval curves every 500 steps that
pass through them; what the seed does not give (control_block's two seeds, the memory figures in
bytes) is chosen to match its means and percentages. Mid-grid, as the seed was written: block_gqa_depth
s42 and the deep variants are still running, block_sparse_depth was killed at 5000, block_rope_depth
crashed at step 80.
"""

from __future__ import annotations

import pandas as pd

GB = 1e9
# variant: [(seed, eval@6000, final train)], tok/s, memory, status
FINAL = {
    "block_hybrid_memory": ([(42, 2.682, 2.620), (1337, 2.691, 2.629), (123, 2.692, 2.630), (456, 2.697, 2.635)],
                            197e3, 120 * GB),
    "block_gqa_depth": ([(1337, 2.691, 2.628)], 248e3, 89 * GB),
    "control_block": ([(42, 2.692, 2.629), (1337, 2.696, 2.633)], 249e3, 89 * GB),
    "block_alibi_depth": ([(42, 2.704, 2.642)], 247e3, 89 * GB),
    "standard": ([(42, 2.716, 2.651)], 459e3, 49 * GB),
    "block_input_dep_query": ([(42, 2.717, 2.657)], 216e3, 97.5 * GB),
    "block_value_proj": ([(42, 3.068, 3.071)], 242e3, 89 * GB),
    "full_attnres": ([(42, 3.215, 3.180)], 163e3, 110 * GB),
}
AT_2500 = {"standard": 2.974, "deep_control_block": 2.946, "deep_baseline": 2.998}
BUDGET, EVERY = 6000, 500


def _curve(at_end: float, end: int, at_2500: float | None = None) -> dict[int, float]:
    """Eval loss every 500 steps to ``end``: 1/sqrt decay through the given points."""
    mid = at_2500 if at_2500 is not None else at_end + 0.25
    out = {}
    for s in range(EVERY, end + 1, EVERY):
        out[s] = mid + (at_end - mid) * (s - 2500) / max(1, end - 2500) if s >= 2500 else mid + 0.4 * (2500 - s) / 2500
    return out


def rows() -> pd.DataFrame:
    """Long-format metric rows (run, variant, seed, step, key, value, status, preset, ...)."""
    out: list[dict[str, object]] = []

    def run(variant: str, seed: int, curve: dict[int, float], status: str = "finished", train: float | None = None,
            tps: float | None = None, mem: float | None = None, message: str | None = None) -> None:
        label = f"{variant}-s{seed}"
        base = {"run": label, "variant": variant, "seed": seed, "status": status, "preset": "paper500m",
                "total_steps": BUDGET, "device": "4x NVIDIA B200", "message": message}
        for step, value in curve.items():
            out.append({**base, "step": step, "key": "eval_loss", "value": value})
        last = max(curve) if curve else 80
        if train is not None:
            out.append({**base, "step": last, "key": "train_loss", "value": train})
        if tps is not None:
            out.append({**base, "step": last, "key": "tokens_per_s", "value": tps})
            out.append({**base, "step": last, "key": "peak_memory_bytes", "value": mem})

    for variant, (seeds, tps, mem) in FINAL.items():
        for seed, ev, train in seeds:
            run(variant, seed, _curve(ev, BUDGET, AT_2500.get(variant)), train=train, tps=tps, mem=mem)
    run("block_gqa_depth", 42, _curve(2.70, 3000), status="running", tps=248e3, mem=89 * GB, train=2.75)
    run("block_sparse_depth", 42, _curve(2.816, 5000), status="killed", train=2.831, tps=246e3, mem=89 * GB,
        message="killed early at step 5000: clearly not converging")
    out.append({"run": "block_rope_depth-s42", "variant": "block_rope_depth", "seed": 42, "status": "failed",
                "preset": "paper500m", "total_steps": BUDGET, "device": "4x NVIDIA B200",
                "message": "crashed at step 80", "step": 80, "key": "train_loss", "value": 9.1})
    for variant in ("deep_control_block", "deep_baseline"):
        run(variant, 42, _curve(AT_2500[variant], 2500, AT_2500[variant]), status="running", tps=150e3, mem=90 * GB,
            train=AT_2500[variant] - 0.05)
    run("deep_hybrid_memory", 42, {500: 3.6, 1000: 3.3}, status="running", tps=120e3, mem=120 * GB)
    out.append({**out[-1], "step": 1200, "key": "train_loss", "value": 3.25})  # it has reached step ~1200
    frame = pd.DataFrame(out)
    return frame
