"""``attnres bench VARIANT...``: training speed and activation memory of variants against standard.

Every model is built from the same preset and trained on the same batch in one process. Steps
alternate ``standard, V1, standard, V2, ..., standard``, and each variant step is divided by the
mean of the two standard steps around it, so drift in machine speed (other tenants, thermal) cancels;
the quoted speed ratio is the median of those paired ratios, and tokens/s are medians of steps.

Activation memory is counted, not sampled: autograd's saved-tensor hooks see every tensor that the
forward keeps for backward, and the distinct storages among them (parameters excluded) are summed.
That figure is what the residual path adds to the memory of a training step, and it is the same on
any device. On CUDA the peak memory a step allocates above the resting weights and optimizer
states of all the models is reported as well.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnres.errors import AttnresError
from attnres.model import depth_attend
from attnres.model.gpt import GPT
from attnres.training.distributed import device_model
from attnres.training.optim import build_optimizer
from attnres.variants.registry import canonical, resolve_run

if TYPE_CHECKING:
    from attnres.tracking.run_store import RunStore

#: The issue's targets: (tokens/s ratio to standard, saved-activation ratio to standard).
TARGETS: dict[str, tuple[float, float | None]] = {
    "control_block": (0.96, 1.10),
    "block_gqa_depth": (0.96, 1.10),
    "block_alibi_depth": (0.96, 1.10),
    "block_mqa_depth": (0.96, 1.10),
    "attnres_paper": (0.96, 1.10),
    "block_hybrid_memory": (0.93, 1.15),
    "full_attnres": (0.80, None),
}


@dataclass
class Contender:
    """One model under benchmark, with its optimizer and timings."""

    name: str
    model: GPT
    opt: torch.optim.Optimizer
    times: list[float]
    peak: int | None = None  # CUDA: most memory a step allocated above what was resident before it


def saved_activation_bytes(model: nn.Module, fn: Callable[[], Tensor]) -> int:
    """Bytes of the distinct storages that autograd saves for backward while ``fn`` runs.

    Parameters and buffers are excluded (they exist whether or not a step runs); a storage saved
    by several ops (the same source read by many sites, views of one tensor) is counted once.
    """
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in owned:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def _step(c: Contender, idx: Tensor, autocast: contextlib.AbstractContextManager) -> float:
    """One training step (forward, backward, AdamW); returns its wall time."""
    cuda = idx.is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        resting = torch.cuda.memory_allocated()  # every model's weights and optimizer state
    t0 = time.perf_counter()
    with autocast:
        _, loss = c.model(idx, idx)
    loss.backward()
    c.opt.step()
    c.opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
        c.peak = max(c.peak or 0, torch.cuda.max_memory_allocated() - resting)
    return time.perf_counter() - t0


def bench_models(variants: list[str], preset: str = "bench", steps: int = 10, warmup: int = 1,
                 overrides: list[str] | None = None, device: str | None = None,
                 progress: Callable[[str], None] | None = None) -> list[dict[str, object]]:
    """Train ``standard`` and each variant for ``warmup + steps`` interleaved steps; one row each."""
    if steps < 1 or warmup < 0:
        raise AttnresError(f"--steps must be at least 1 and --warmup at least 0 (got {steps}, {warmup})")
    names = ["standard", *[n for n in dict.fromkeys(canonical(v) for v in variants) if n != "standard"]]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in {"cpu", "cuda"} or (device == "cuda" and not torch.cuda.is_available()):
        raise AttnresError(f"--device {device}: choose cpu, or cuda on a machine with a CUDA GPU")
    dev = torch.device(device)
    contenders = []
    for name in names:
        cfg = resolve_run(name, preset, 0, overrides)
        torch.manual_seed(0)
        model = GPT(cfg.model).to(dev)
        opt = build_optimizer(model, cfg.train.lr, cfg.train.weight_decay, (cfg.train.beta1, cfg.train.beta2),
                              fused=dev.type == "cuda")
        contenders.append(Contender(name, model, opt, []))
    batch, seq = cfg.train.batch_size, cfg.model.seq_len
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg.model.vocab_size, (batch, seq), generator=gen).to(dev)
    bf16 = dev.type == "cuda" and cfg.train.dtype != "float32"

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(dev.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    saved = {}
    for c in contenders:
        def loss_of(c: Contender = c) -> Tensor:
            with autocast():
                return c.model(idx, idx)[1]
        saved[c.name] = saved_activation_bytes(c.model, loss_of)
    # Standard runs before and after every variant (S V1 S V2 S ... S), so each variant step is
    # compared with the mean of its two neighbouring standard steps: drift in machine speed cancels.
    base, others = contenders[0], contenders[1:]
    ratios: dict[str, list[float]] = {c.name: [] for c in others}
    for r in range(warmup + steps):
        timed = r >= warmup
        prev = _step(base, idx, autocast())
        if timed:
            base.times.append(prev)
        for c in others:
            if progress:
                progress(f"step {r + 1}/{warmup + steps}: {c.name}")
            dt = _step(c, idx, autocast())
            nxt = _step(base, idx, autocast())
            if timed:
                c.times.append(dt)
                base.times.append(nxt)
                ratios[c.name].append((prev + nxt) / 2 / dt)
            prev = nxt
    tokens = batch * seq
    path = depth_attend.kernel_path(dev.type)
    rows = []
    for c in contenders:
        tps = tokens / statistics.median(c.times)
        paired = ratios.get(c.name, [1.0])
        speed = statistics.median(paired)
        q1, q3 = (statistics.quantiles(paired, n=4)[::2] if len(paired) > 1 else (speed, speed))
        speed_target, mem_target = TARGETS.get(c.name, (None, None))
        mem_ratio = saved[c.name] / saved[base.name]
        rows.append({
            "variant": c.name, "preset": preset, "device": str(dev), "depth_kernel": path, "tokens_per_step": tokens,
            "device_model": device_model(dev), "threads": torch.get_num_threads(),
            "dtype": "bfloat16" if bf16 else "float32",
            "n_layer": c.model.cfg.n_layer, "d_model": c.model.cfg.d_model, "model": asdict(c.model.cfg),
            "step_ms": 1e3 * statistics.median(c.times),
            "step_ms_min": 1e3 * min(c.times), "step_ms_max": 1e3 * max(c.times),
            "tokens_per_s": tps, "speed_ratio": speed, "speed_ratio_q1": q1, "speed_ratio_q3": q3,
            "peak_memory_bytes": c.peak,
            "saved_bytes_per_token": saved[c.name] / tokens, "saved_ratio": mem_ratio,
            "speed_target": speed_target, "saved_target": mem_target,
            "meets_targets": None if speed_target is None else bool(
                speed >= speed_target and (mem_target is None or mem_ratio <= mem_target)),
        })
    return rows


def store_session(store: RunStore, rows: list[dict[str, object]], preset: str, overrides: list[str] | None,
                  steps: int) -> int:
    """Keep a bench's rows in the database as one session (:mod:`attnres.tracking.speed`): a report takes a
    variant's speed cost from the newest one on the runs' device when the runs trained under different
    conditions. Returns the session's number."""
    from attnres.tracking import DatabaseError

    first = rows[0]
    try:
        return store.record_bench(rows, str(first["device_model"]), int(first["threads"]),
                                  str(first["dtype"]), preset, overrides or [], steps)
    except DatabaseError as exc:
        raise AttnresError(f"the bench is not recorded: {str(exc).splitlines()[0]}") from None
