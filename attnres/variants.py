"""The registry of residual variants: name -> description + residual spec (+ shape change).

Every variant of the results document is one entry here, and nothing else in the code branches
on a variant's name. Descriptions state exactly what is built, so ``attnres variants`` is the
source of truth for what a name means.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from attnres.config import ModelConfig, ResidualSpec, RunConfig, apply_overrides, get_preset
from attnres.errors import unknown

# Block AttnRes as the results document runs it: blocks of 3 layers, mean summaries, the current
# block's partial state, a learned zero-initialised query per layer, keys RMSNorm(source) * gain.
_BLOCK = ResidualSpec(kind="depth", block_size=3, reduce="mean", partial=True)
DEEP_WIDTH_RATIO = 1080 / 1536  # the document's 48L d1080 vs 24L d1536


@dataclass(frozen=True)
class Variant:
    """One named residual variant."""

    name: str
    description: str
    residual: ResidualSpec
    depth_mult: int = 1  # deep variants double the layers ...
    width_ratio: float = 1.0  # ... and narrow the width to keep the parameter count

    def apply(self, model: ModelConfig) -> ModelConfig:
        """Return the preset's model reshaped and rewired for this variant."""
        d_model = model.d_model
        if self.width_ratio != 1.0:
            # Keep the head count; round the head dim to an even number (RoPE rotates pairs).
            head_dim = 2 * max(1, round(model.d_model * self.width_ratio / model.n_head / 2))
            d_model = head_dim * model.n_head
        return replace(model, n_layer=model.n_layer * self.depth_mult, d_model=d_model,
                       residual=self.residual)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant("standard", "Normal pre-norm residual connections: x = x + layer(x).", ResidualSpec()),
        Variant(
            "full_attnres",
            "Each layer attends over the embedding and every prior layer output individually "
            "(per-layer zero-init query, keys RMSNorm(output)*gain). O(L^2) in depth.",
            replace(_BLOCK, block_size=1, partial=False),
        ),
        Variant(
            "control_block",
            "Blocks of 3 layers; each layer attends over the embedding, completed block summaries "
            "(mean of the block's 3 layer outputs) and the current block's partial state (mean of its "
            "outputs so far). Per-layer zero-init query; keys RMSNorm(source)*per-layer gain.",
            _BLOCK,
        ),
        Variant(
            "block_input_dep_query",
            "control_block plus an input-dependent query: q = w_l + B_l A_l RMSNorm(h), rank 16, "
            "where h is the layer's standard-residual input (previous input + previous output); "
            "B_l zero-init.",
            replace(_BLOCK, query_rank=16),
        ),
        Variant(
            "block_hybrid_memory",
            "control_block sources plus a sliding window of the 4 most recent raw layer outputs.",
            replace(_BLOCK, window=4),
        ),
        Variant(
            "block_alibi_depth",
            "control_block with an ALiBi bias on depth logits: -slope_l * (block distance), "
            "one learned slope per layer, zero-init.",
            replace(_BLOCK, alibi=True),
        ),
        Variant(
            "block_gqa_depth",
            "control_block with queries shared across groups of 4 layers (4x fewer query "
            "parameters); keys stay per block.",
            replace(_BLOCK, query="group", query_group=4),
        ),
        Variant(
            "block_rope_depth",
            "control_block with rotary encoding of depth position (block index) on queries and keys.",
            replace(_BLOCK, rope=True),
        ),
        Variant(
            "block_sparse_depth",
            "control_block where each layer attends only to the 4 nearest blocks (embedding = "
            "block 0), every 4th older block, and its partial state.",
            replace(_BLOCK, sparse_near=4, sparse_stride=4),
        ),
        Variant(
            "block_value_proj",
            "control_block where completed block summaries pass through a learned d x d value "
            "projection (I + delta, delta zero-init, shared) before being mixed; keys use the raw "
            "summaries.",
            replace(_BLOCK, value_proj=True),
        ),
        Variant(
            "block_mqa_depth",
            "Proposed: multi-query depth attention. One query shared by every layer; keys per "
            "block, RMSNorm(summary) * a learned gain owned by the block's depth position.",
            replace(_BLOCK, query="shared", key_gain="source"),
        ),
        Variant(
            "attnres_paper",
            "Block AttnRes as in Kimi's 'Attention Residuals' (arXiv 2603.15031): every attention "
            "and MLP sublayer is a depth step; sources are the embedding, block sums (N=8 blocks) "
            "and the partial sum; keys RMSNorm(v)*site gain; zero-init query per site; separate "
            "mixes before attention, MLP and the final norm; no 1/sqrt(d).",
            ResidualSpec(kind="depth", granularity="sublayer", n_blocks=8, reduce="sum", partial=True),
        ),
        Variant(
            "deep_baseline",
            "standard with twice the layers at 1080/1536 of the width (48L d1080 at paper500m).",
            ResidualSpec(), depth_mult=2, width_ratio=DEEP_WIDTH_RATIO,
        ),
        Variant(
            "deep_control_block",
            "control_block with twice the layers at 1080/1536 of the width (16 blocks of 3).",
            _BLOCK, depth_mult=2, width_ratio=DEEP_WIDTH_RATIO,
        ),
        Variant(
            "deep_hybrid_memory",
            "block_hybrid_memory with twice the layers at 1080/1536 of the width.",
            replace(_BLOCK, window=4), depth_mult=2, width_ratio=DEEP_WIDTH_RATIO,
        ),
    ]
}

ALIASES: dict[str, str] = {"baseline_standard": "standard", "baseline": "standard"}


def canonical(name: str) -> str:
    """Resolve aliases; raise a clear error (with a suggestion) for unknown names."""
    name = ALIASES.get(name, name)
    if name not in VARIANTS:
        raise unknown("variant", name, list(VARIANTS) + list(ALIASES))
    return name


def get_variant(name: str) -> Variant:
    return VARIANTS[canonical(name)]


def resolve_run(variant: str, preset: str, seed: int, overrides: list[str] | None = None,
                data: str = "builtin") -> RunConfig:
    """Build the full config of one run: preset, then variant, then ``key=value`` overrides."""
    p = get_preset(preset)
    v = get_variant(variant)
    model, train = apply_overrides(v.apply(p.model), p.train, overrides or [])
    return RunConfig(variant=v.name, preset=p.name, seed=seed, model=model, train=train, data=data)
