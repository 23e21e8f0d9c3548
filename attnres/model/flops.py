"""Training compute of a model, in FLOPs: what a scaling law is fitted against.

The count follows the convention of Kaplan et al. and Chinchilla (a multiply-add is 2 FLOPs; a training
step is 3 forward passes: the forward, and the backward's two matmuls per forward matmul):

* every non-embedding parameter costs 2 FLOPs per token forward, as ``6·N`` counts it. For the layers'
  weight matrices that is exactly their matmul work; the few vectors among the parameters (norm gains, the
  depth attention's queries, key gains and ALiBi slopes) do elementwise work or none per token, and are
  charged as the convention charges them (under 1 % of N);
* the (tied) output head's ``vocab × d`` multiply is done whether or not its weight is the embedding's:
  ``2 · vocab · d`` per token;
* causal self-attention adds ``QKᵀ`` and the weighted sum of values: ``2 · 2 · seq_len · d`` per layer and
  token forward (counted over the whole context, as the convention does);
* the depth attention (AttnRes) adds, at each of its sites, scores and the weighted sum over the site's ``S``
  sources (``2 · 2 · S · d``). ``S`` per site is the variant's source plan
  (:meth:`attnres.config.ResidualSpec.source_plan`): it grows with depth for full AttnRes, stays flat for a
  windowed or blocked one. Its weight matrices are counted by where the model applies them, not once per
  token: an input-dependent query of rank ``r`` projects each site's input through its own two factors
  (``2 · 2 · d · r`` per site), and a value projection maps every completed block summary (``2 · d²`` per
  block). They are taken out of ``N``'s count, so that nothing is counted twice.

Elementwise work (norms of the stream and of the depth attention's keys, SwiGLU's gate, softmax, rotations)
is left out, as in the convention. :func:`matmul_flops_per_token` is the count without the vectors' charge:
the matmul work alone, which ``tests/test_flops.py`` checks against what a training step of every variant does.
"""

from __future__ import annotations

from attnres.config import ModelConfig, RunConfig


def layer_weights(cfg: ModelConfig) -> int:
    """The layers' weight matrices, each applied once per token: attention's QKV and output projection,
    SwiGLU's gate-and-up and down projection."""
    d = cfg.d_model
    return cfg.n_layer * (4 * d * d + 3 * d * cfg.mlp_hidden)


def depth_weights(cfg: ModelConfig) -> int:
    """The depth attention's weight matrices, whose work :func:`depth_flops_per_token` counts where they are
    applied: the input-dependent query's two ``d × r`` factors per site, the value projection's ``d × d``."""
    spec, d = cfg.residual, cfg.d_model
    if spec.kind != "depth":
        return 0
    sites = cfg.depth_steps + 1  # every step's input and the readout
    return sites * 2 * d * spec.query_rank + (d * d if spec.value_proj else 0)


def depth_flops_per_token(cfg: ModelConfig) -> int:
    """Forward FLOPs per token of the depth attention (0 for the standard residual): scores and mix per
    site and source, the query factors per site, the value projection per completed block summary."""
    spec, d = cfg.residual, cfg.d_model
    if spec.kind != "depth":
        return 0
    plan = spec.source_plan(cfg.depth_steps)
    mix = 2 * 2 * d * sum(len(sources) for sources in plan)
    query = len(plan) * 2 * 2 * d * spec.query_rank  # h·A, then ·B, at each site (the readout's included)
    blocks = cfg.depth_steps // spec.blocks_for(cfg.depth_steps) if spec.value_proj else 0
    return mix + query + blocks * 2 * d * d


def _context_flops_per_token(cfg: ModelConfig) -> int:
    """Forward FLOPs per token that no parameter count holds: the output head and causal attention."""
    head = 2 * cfg.vocab_size * cfg.d_model
    attention = cfg.n_layer * 2 * 2 * cfg.seq_len * cfg.d_model
    return head + attention


def matmul_flops_per_token(cfg: ModelConfig) -> int:
    """Forward matmul FLOPs per token, exactly: :func:`forward_flops_per_token` without the convention's charge
    for the vector parameters."""
    return 2 * layer_weights(cfg) + _context_flops_per_token(cfg) + depth_flops_per_token(cfg)


def forward_flops_per_token(cfg: ModelConfig, non_embedding_params: int) -> int:
    """Forward FLOPs per token: 2 per non-embedding parameter (the depth attention's weight matrices counted
    where they are applied instead), the output head, causal attention and the depth attention."""
    per_token = non_embedding_params - depth_weights(cfg)
    return 2 * per_token + _context_flops_per_token(cfg) + depth_flops_per_token(cfg)


def tokens_per_step(cfg: RunConfig, world_size: int = 1) -> int:
    """Tokens one optimizer step trains on: sequences per rank and micro-step, micro-steps, ranks."""
    return cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len * max(1, world_size)


def training_flops(cfg: RunConfig, non_embedding_params: int, world_size: int = 1, steps: int | None = None) -> float:
    """FLOPs of training ``steps`` steps (default: the run's budget): 3 forward passes per token."""
    steps = cfg.train.steps if steps is None else steps
    return 3.0 * forward_flops_per_token(cfg.model, non_embedding_params) * tokens_per_step(cfg, world_size) * steps
