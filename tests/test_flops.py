"""Training FLOPs (attnres.model.flops) against the matmuls a training step of each variant really does.

One forward and backward of a small model runs under ``torch.utils.flop_counter.FlopCounterMode``, whose matmul
count (mm, addmm, bmm, baddbmm) is exact. Two kinds of work it cannot see are added here, each as the formula's
convention counts it: causal self-attention (SDPA on CPU is not among the ops it counts) and the depth
attention's scores and mix, which the C kernel computes out of its sight. The depth attention's sources are taken
from what the model recorded at each site, not from the formula's source plan, so a formula that miscounts them
fails. The formula's matmul part must then equal the count exactly, and its total, which also charges the vector
parameters (norm gains, depth queries and key gains) 2 FLOPs a token as 6·N does, must be within 2 %.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnres.config import RunConfig
from attnres.model import flops
from attnres.model.gpt import GPT
from attnres.model.residual import DepthAttention
from attnres.variants.registry import VARIANTS, resolve_run

# 6 layers (two completed blocks of 3; deep_* variants train 12 at d48 from this), a short context and a small
# vocabulary; one step of 2 sequences
SHAPE = ["d_model=64", "n_head=4", "seq_len=16", "vocab_size=128", "batch_size=2", "steps=1"]
LAYERS = 6
# block_sparse_depth drops blocks more than 4 depth positions back (but every 4th): at 6 layers it attends as
# control_block does, and the readout of 15 layers is the first site to drop one
CASES = [(name, LAYERS) for name in sorted(VARIANTS)] + [("block_sparse_depth", 15)]
MATMULS = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm}


def measured(run: RunConfig) -> tuple[int, int, int, int]:
    """A training step's matmul FLOPs (counted by the counter, causal attention's, the depth attention's) and the
    model's non-embedding parameters."""
    cfg = run.model
    torch.manual_seed(0)
    model = GPT(cfg)
    depth = model.residual if isinstance(model.residual, DepthAttention) else None
    if depth is not None:
        depth.record = True  # the sources each site attended to (its weights, detached: no matmul)
    idx = torch.randint(cfg.vocab_size, (run.train.batch_size, cfg.seq_len))
    with FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    counted = sum(n for op, n in counter.get_flop_counts()["Global"].items() if op in MATMULS)
    tokens = idx.numel()
    # SDPA: QKᵀ and the weighted sum of values, 2·seq_len·d each per layer and token, over the whole context as
    # the Kaplan/Chinchilla convention counts it (not halved for the causal mask); 3 passes a step
    attention = 3 * tokens * cfg.n_layer * 2 * 2 * cfg.seq_len * cfg.d_model
    # the depth kernel's logits (K·u) and mix (Σ w·V): 2·d each per site, source and token; 3 passes a step
    sources = sum(len(record.kinds) for record in depth.records) if depth is not None else 0
    depth_mix = 3 * tokens * sources * 2 * 2 * cfg.d_model
    weights = sum(getattr(depth, n).numel() for n in ("query_down", "query_up", "value_delta")
                  if depth is not None and isinstance(getattr(depth, n, None), torch.nn.Parameter))
    assert flops.depth_weights(cfg) == weights  # the weight matrices the formula counts where they are applied
    return counted, attention, depth_mix, model.num_params()["non_embedding"]


@pytest.mark.parametrize("kernel_path", ["c"], indirect=True)  # depth attention in C: none of it counted twice
@pytest.mark.parametrize(("name", "n_layer"), CASES)
def test_training_flops_are_the_matmuls_a_step_does(name: str, n_layer: int, kernel_path: str) -> None:
    # at the shape the variant trains at (deep_*: twice the layers, narrower)
    run = resolve_run(name, "tiny", 0, [*SHAPE, f"n_layer={n_layer}"])
    counted, attention, depth, non_embedding = measured(run)
    tokens = run.train.batch_size * run.model.seq_len
    assert counted + attention + depth == 3 * tokens * flops.matmul_flops_per_token(run.model), name
    total = flops.training_flops(run, non_embedding)
    assert total == pytest.approx(counted + attention + depth, rel=0.02), name
