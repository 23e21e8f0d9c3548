"""The registry of residual variants: name -> description + residual spec (+ shape change).

Every variant of the results document is one entry here, and nothing else in the code branches
on a variant's name. Descriptions state exactly what is built, so ``attnres variants`` is the
source of truth for what a name means.

A variant's ``revision`` goes up when what it trains changes without its config changing; it is
recorded with every run and is part of the config hash, so a relaunch never counts a run of an
earlier revision as done, and a run of an earlier revision is never resumed by newer code.

* revision 2 (every depth variant): depth queries, key gains and ALiBi slopes are free of weight
  decay; under bf16 autocast the depth logits, softmax, block and partial sums and the mix are
  float32; block_gqa_depth's effective query is one per group of 4 layers (key gains moved to the
  block sources); block_rope_depth rotates with base = number of depth positions.
* revision 3 (block_gqa_depth, block_mqa_depth): clean ablations of control_block. Each changes only
  who owns the queries; the keys are control_block's again (a gain per layer), where revision 2 also
  moved the gains to the sources, a second change that confounded "query sharing costs little". The
  per-source gain is its own variant, block_source_gain. Runs of revision 2 are listed as not compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from attnres.config import (
    ModelConfig,
    Preset,
    ResidualSpec,
    RunConfig,
    apply_overrides,
    get_preset,
    residual_overrides,
)
from attnres.errors import AttnresError, unknown

# Block AttnRes as the results document runs it: blocks of 3 layers, mean summaries, the current
# block's partial state, a learned zero-initialised query per layer, keys RMSNorm(source) * gain.
BLOCK = ResidualSpec(kind="depth", block_size=3, reduce="mean", partial=True)
DEEP_WIDTH_RATIO = 1080 / 1536  # the document's 48L d1080 vs 24L d1536
_DEPTH_REVISION = 2  # see the module docstring
_ABLATION_REVISION = 3  # block_gqa_depth and block_mqa_depth: control_block's keys (see the module docstring)


@dataclass(frozen=True)
class Variant:
    """One named residual variant."""

    name: str
    description: str
    residual: ResidualSpec
    depth_mult: int = 1  # deep variants double the layers ...
    width_ratio: float = 1.0  # ... and narrow the width to keep the parameter count
    revision: int = 1

    def apply(self, preset: Preset) -> ModelConfig:
        """Return the preset's model reshaped and rewired for this variant.

        A deep variant is defined relative to the 24-layer model; on a preset that is already a deep
        shape it would double the depth again, so it is refused with the preset to use instead.
        """
        model = preset.model
        if self.depth_mult != 1 and preset.deepened_from:
            raise AttnresError(
                f"{self.name} doubles the depth of a preset, and preset {preset.name} is already deep "
                f"({model.n_layer}L d{model.d_model}): use --preset {preset.deepened_from} "
                f"({self.name} there is {model.n_layer}L d{model.d_model})")
        width = self.width(model.d_model, model.n_head)
        if self.width_ratio < 1 and width >= model.d_model:
            raise AttnresError(f"{self.name} narrows the width to ~{self.width_ratio:.2f} with the heads kept, and "
                               f"{model.n_head} heads of d_model {model.d_model} leave no head dimension to narrow "
                               f"(it would be {width} wide): give fewer heads or a wider d_model")
        return replace(model, n_layer=model.n_layer * self.depth_mult, d_model=width, residual=self.residual)

    def width(self, d_model: int, n_head: int) -> int:
        """The width this variant trains at for a given width: the ratio, heads kept, the head dim rounded to an
        even number (RoPE rotates pairs)."""
        if self.width_ratio == 1.0:
            return d_model
        return 2 * max(1, round(d_model * self.width_ratio / n_head / 2)) * n_head

    def given(self, n_layer: int, d_model: int, n_head: int, preferred: int) -> tuple[int, int] | None:
        """The (layers, width) a user gives for this variant to train ``n_layer`` layers at ``d_model``: the
        inverse of its shape rule, the width ``preferred`` where it maps there (None: no given shape does)."""
        if n_layer % self.depth_mult:
            return None
        widths = [preferred, *range(n_head, 4 * d_model + 4 * n_head, n_head)]
        width = next((w for w in widths if self.width(w, n_head) == d_model), None)
        return None if width is None else (n_layer // self.depth_mult, width)


_KEYS = "keys RMSNorm(source) * a learned gain (init 1)"
_STEP0 = "zero-init queries, so step 0 is the plain average of the sources"

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant("standard", "Normal pre-norm residual connections: x = x + layer(x).", ResidualSpec()),
        Variant(
            "full_attnres",
            f"Each layer attends over the embedding and every prior layer output individually, one query "
            f"per layer (and one for the readout before the final norm); {_KEYS} per layer; {_STEP0}. "
            "O(L^2) in depth.",
            replace(BLOCK, block_size=1, partial=False), revision=_DEPTH_REVISION,
        ),
        Variant(
            "control_block",
            "Blocks of 3 layers; each layer attends over the embedding, completed block summaries "
            "(mean of the block's 3 layer outputs) and the current block's partial state (mean of its "
            f"outputs so far). One query per layer and one for the readout; {_KEYS} per layer; {_STEP0}.",
            BLOCK, revision=_DEPTH_REVISION,
        ),
        Variant(
            "block_input_dep_query",
            "control_block plus an input-dependent query: q = w_l + B_l A_l RMSNorm(h), rank 16, "
            "where h is the layer's standard-residual input (previous input + previous output); "
            "B_l zero-init, A_l ~ N(0, 1/d).",
            replace(BLOCK, query_rank=16), revision=_DEPTH_REVISION,
        ),
        Variant(
            "block_hybrid_memory",
            "control_block sources plus a sliding window of the 4 most recent raw layer outputs "
            "(newest first; they may overlap the partial state).",
            replace(BLOCK, window=4), revision=_DEPTH_REVISION,
        ),
        Variant(
            "block_alibi_depth",
            "control_block with an ALiBi bias on depth logits: -slope_l * (block distance), "
            "one learned slope per layer (and one for the readout), zero-init.",
            replace(BLOCK, alibi=True), revision=_DEPTH_REVISION,
        ),
        Variant(
            "block_gqa_depth",
            "control_block with grouped queries: one query per group of 4 consecutive layers (layers "
            "0-3, 4-7, ...; groups do not follow the blocks of 3, their boundaries meet every 12 layers), "
            "plus one for the readout: 4x fewer layer-query parameters when the layers divide by 4. Keys as "
            "control_block's (a gain per layer), so this is query sharing alone; the per-layer gain still "
            "scales the shared query's match per layer (block_source_gain moves the gains to the sources).",
            replace(BLOCK, query="group", query_group=4), revision=_ABLATION_REVISION,
        ),
        Variant(
            "block_rope_depth",
            "control_block with rotary encoding of depth position (0 = embedding, k = block k) on "
            "queries and keys, every channel pair (2i, 2i+1) rotated at n_pos^(-2i/d) rad per block "
            "(base = the number of depth positions n_pos): from 1 rad per block down to about 1 rad "
            "over the whole depth.",
            replace(BLOCK, rope=True), revision=_DEPTH_REVISION,
        ),
        Variant(
            "block_sparse_depth",
            "control_block where each layer attends only to the 4 nearest blocks (embedding = "
            "block 0), every 4th older block, and its partial state.",
            replace(BLOCK, sparse_near=4, sparse_stride=4), revision=_DEPTH_REVISION,
        ),
        Variant(
            "block_value_proj",
            "control_block where completed block summaries pass through a learned d x d value "
            "projection (I + delta, delta zero-init, shared) before being mixed; keys use the raw "
            "summaries.",
            replace(BLOCK, value_proj=True), revision=_DEPTH_REVISION,
        ),
        Variant(
            "block_mqa_depth",
            "Proposed: multi-query depth attention. control_block with one query shared by every layer "
            "and the readout; keys as control_block's (a gain per layer), so this is the single query alone.",
            replace(BLOCK, query="shared"), revision=_ABLATION_REVISION,
        ),
        Variant(
            "block_source_gain",
            "control_block with the key gains owned by the depth position (embedding, block k) instead of "
            "the layer: per-layer gains are redundant with per-layer queries; this tests that key "
            "parameterisation on its own.",
            replace(BLOCK, key_gain="source"), revision=_DEPTH_REVISION,
        ),
        Variant(
            "attnres_paper",
            "Block AttnRes as in Kimi's 'Attention Residuals' (arXiv 2603.15031): every attention "
            "and MLP sublayer is a depth step; sources are the embedding, block sums (N=8 blocks) "
            "and the partial sum; keys RMSNorm(v)*site gain; zero-init query per site; separate "
            "mixes before attention, MLP and the final norm; no 1/sqrt(d).",
            ResidualSpec(kind="depth", granularity="sublayer", n_blocks=8, reduce="sum", partial=True),
            revision=_DEPTH_REVISION,
        ),
        Variant(
            "deep_baseline",
            "standard with twice the layers at 1080/1536 of the width (48L d1080 at paper500m). "
            "Defined from a 24-layer preset: refused on deep48, which is already this shape.",
            ResidualSpec(), depth_mult=2, width_ratio=DEEP_WIDTH_RATIO,
        ),
        Variant(
            "deep_control_block",
            "control_block with twice the layers at 1080/1536 of the width (48L d1080 at paper500m: "
            "16 blocks of 3). Refused on deep48.",
            BLOCK, depth_mult=2, width_ratio=DEEP_WIDTH_RATIO, revision=_DEPTH_REVISION,
        ),
        Variant(
            "deep_hybrid_memory",
            "block_hybrid_memory with twice the layers at 1080/1536 of the width (48L d1080 at "
            "paper500m). Refused on deep48.",
            replace(BLOCK, window=4), depth_mult=2, width_ratio=DEEP_WIDTH_RATIO, revision=_DEPTH_REVISION,
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
                data: str = "builtin", experiment: str = "") -> RunConfig:
    """Build the full config of one run: the preset with the ``key=value`` overrides of its shape and training,
    then the variant's rule applied to that shape (a deep variant doubles the *given* layers at ~0.70 of the
    *given* width, heads kept: ``--set n_layer=2`` makes deep_baseline 4 layers, never the shallow model), then
    overrides of the residual's wiring (``block_size=4``).

    ``experiment`` names the experiment (default: the preset's); the default one is left out of the
    config hash, so runs made before experiments existed keep theirs.
    """
    p = get_preset(preset)
    v = get_variant(variant)
    shape, wiring = residual_overrides(overrides or [])
    given, train = apply_overrides(p.model, p.train, shape)
    model, train = apply_overrides(v.apply(replace(p, model=given)), train, wiring)
    return RunConfig(variant=v.name, preset=p.name, seed=seed, model=model, train=train, data=data,
                     revision=v.revision, experiment="" if experiment == p.name else experiment)


def superseded(variant: str, config_json: str) -> bool:
    """Whether a run recorded with this config was trained by an earlier revision of its variant.

    Imported runs (recorded elsewhere: no model config) are never superseded.
    """
    config = json.loads(config_json or "{}")
    if "model" not in config or variant not in VARIANTS:
        return False
    return int(config.get("revision", 1)) < VARIANTS[variant].revision


def superseded_runs(runs: list[tuple[str, str]]) -> list[bool]:
    """:func:`superseded` of each (variant, config JSON): a listing asks once for all its rows."""
    return [superseded(variant, config_json) for variant, config_json in runs]


def check_revision(cfg: RunConfig, run_id: int | str) -> None:
    """Refuse to train a recorded run whose variant has changed since it was recorded."""
    current = get_variant(cfg.variant).revision
    if cfg.revision != current:
        raise AttnresError(
            f"run {run_id} was recorded with revision {cfg.revision} of {cfg.variant}, and this version "
            f"trains revision {current} (see `attnres variants`): launch it again as a new run")


def default_settings(variant: str, preset: str) -> dict[str, str]:
    """A variant's settings at a preset before any ``--set``, by their ``--set`` names: what a run's own values
    are measured against (its cell of a sweep, a one-variant sweep's baseline value)."""
    from attnres.run_settings import settings

    return settings(resolve_run(variant, preset, 0).to_json())
