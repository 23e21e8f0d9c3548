"""Training compute of a model, in FLOPs: what a scaling law is fitted against.

The count follows the convention of Kaplan et al. and Chinchilla (a multiply-add is 2 FLOPs; a training
step is 3 forward passes: the forward, and the backward's two matmuls per forward matmul):

* every matmul weight costs 2 FLOPs per token forward: the non-embedding parameters, and the (tied) output
  head, whose ``vocab × d`` multiply is done whether or not its weight is the embedding's;
* causal self-attention adds ``QKᵀ`` and the weighted sum of values: ``2 · 2 · seq_len · d`` per layer and
  token forward (counted over the whole context, as the convention does);
* the depth attention (AttnRes) adds, at each of its sites, scores and the weighted sum over the site's ``S``
  sources (``2 · 2 · S · d``), the RMS norm of each source's key (``3 · S · d``) and, for an input-dependent
  query of rank ``r``, its two projections (``2 · 2 · d · r``). ``S`` per site is the variant's source plan
  (:meth:`attnres.config.ResidualSpec.source_plan`): it grows with depth for full AttnRes, stays flat for a
  windowed or blocked one. The depth attention's own parameters are in the non-embedding count already.

Elementwise work (norms of the stream, SwiGLU's gate, softmax) is left out, as in the convention.
"""

from __future__ import annotations

from attnres.config import ModelConfig, RunConfig


def depth_flops_per_token(cfg: ModelConfig) -> int:
    """Forward FLOPs per token of the depth attention (0 for the standard residual)."""
    spec = cfg.residual
    plan = spec.source_plan(cfg.depth_steps)
    d = cfg.d_model
    per_source = 2 * 2 * d + 3 * d  # scores and weighted sum; the key's RMS norm
    query = 2 * 2 * d * spec.query_rank if getattr(spec, "query_rank", 0) else 0
    return sum(len(sources) * per_source + (query if sources else 0) for sources in plan)


def forward_flops_per_token(cfg: ModelConfig, non_embedding_params: int) -> int:
    """Forward FLOPs per token: matmul weights, the output head, causal attention and the depth attention."""
    head = 2 * cfg.vocab_size * cfg.d_model
    attention = cfg.n_layer * 2 * 2 * cfg.seq_len * cfg.d_model
    return 2 * non_embedding_params + head + attention + depth_flops_per_token(cfg)


def tokens_per_step(cfg: RunConfig, world_size: int = 1) -> int:
    """Tokens one optimizer step trains on: sequences per rank and micro-step, micro-steps, ranks."""
    return cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len * max(1, world_size)


def training_flops(cfg: RunConfig, non_embedding_params: int, world_size: int = 1, steps: int | None = None) -> float:
    """FLOPs of training ``steps`` steps (default: the run's budget): 3 forward passes per token."""
    steps = cfg.train.steps if steps is None else steps
    return 3.0 * forward_flops_per_token(cfg.model, non_embedding_params) * tokens_per_step(cfg, world_size) * steps
