"""What ``attnres variants`` shows: each variant's description, revision, depth sources and parameters."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from attnres.errors import AttnresError
from attnres.variants.registry import ALIASES, VARIANTS, resolve_run

if TYPE_CHECKING:
    from attnres.config import ModelConfig


def depth_sources(cfg: ModelConfig) -> list[int]:
    """How many sources each depth-attention site attends to ([] for the standard residual)."""
    return [len(sources) for sources in cfg.residual.source_plan(cfg.depth_steps)]


PARAM_COLUMNS = ["step queries", "readout query", "key gains", "other"]
PARAMS_NOTE = ("Depth-attention parameters. step queries: those of the layers' (or sublayers') sites, "
               "low-rank query factors included; readout query: the mix before the final norm has a query "
               "of its own (block_mqa_depth shares its one query with it); key gains: the key norm's gains; "
               "other: ALiBi slopes, the value projection; depth: their sum; total: the whole model (the "
               "output layer is tied to the token embedding); non-embedding: without the token embedding; "
               "total vs control_block: the difference of the total. sources: how many tensors a site attends "
               "over (fewest-most). The first layer's site attends to the embedding alone, so its query row "
               "has no effect.")
REFERENCE = "control_block"
SHAPE_NOTE = ("Deep variants apply their shape rule to the settings given: 2x the layers of the preset, or of "
              "--set n_layer, at ~0.70 of its width (or --set d_model), heads kept; --set of a residual setting "
              "(block_size, window, ...) changes the variant's wiring after it. `attnres launch --dry-run` prints each "
              "run's model, and `attnres variants --params --set KEY=VALUE` counts it.")


def changes(name: str) -> str:
    """Exactly what a variant changes against control_block, from its traits (every field of its spec)."""
    from attnres.variants.traits import traits_of

    if name == REFERENCE:
        return "— (the reference: block AttnRes as the results document runs it)"
    have = traits_of(name)
    if "depth_attention" not in have:
        return "no depth attention: x = x + layer(x)" + (f"; {have['deep']}" if "deep" in have else "")
    return "; ".join(value for trait, value in have.items() if trait != "depth_attention")


def shape(cfg: ModelConfig) -> str:
    """'8L d48 h4': layers, width and heads."""
    return f"{cfg.n_layer}L d{cfg.d_model} h{cfg.n_head}"


def model_line(cfg: ModelConfig) -> str:
    """What a run trains, in one line: its layers, width, heads and parameters."""
    params = model_params(cfg)
    return (f"model: {cfg.n_layer} layers, width {cfg.d_model}, {cfg.n_head} heads, {params['total']:,} parameters "
            f"({params['non_embedding']:,} non-embedding)")


def variant_rows(preset: str | None, overrides: list[str] | None = None) -> list[dict[str, object]]:
    """Name, description, revision, what it changes against control_block and depth sources (min-max over
    sites); at a preset, parameters.

    The plain listing is worked out from the configs alone (no torch, no model: it answers at once);
    parameter counts need the models, built on the meta device, so only ``--params`` builds them.
    """
    aliases = {v: [a for a, t in ALIASES.items() if t == v] for v in VARIANTS}
    rows = []
    reference = model_params(resolve_run(REFERENCE, preset, 0, overrides).model) if preset else {}
    for name, v in VARIANTS.items():
        try:
            cfg = resolve_run(name, preset or "tiny", 0, overrides).model
        except AttnresError as exc:  # a deep variant on a preset that is already deep
            rows.append({"variant": name, "shape": "refused", "sources": "—", **dict.fromkeys(PARAM_COLUMNS, "—"),
                         "depth": "—", "total": f"{exc}".split(": ")[-1], "non-embedding": "—",
                         "total vs control_block": "—"})
            continue
        counts = depth_sources(cfg)
        sources = f"{min(counts)}-{max(counts)}" if counts else "all"
        if preset:  # a parameter table: the descriptions and aliases are in the plain listing
            rows.append({"variant": name, "shape": shape(cfg), "sources": sources,
                         **_param_columns(cfg, reference)})
        else:
            rows.append({"variant": name + (f" ({', '.join(aliases[name])})" if aliases[name] else ""),
                         "rev": v.revision, "description": v.description, "changes vs control_block": changes(name),
                         "depth sources": sources})
    return rows


#: the initializers a model calls (torch.nn.init); on the meta device they have no values to fill
_INITS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
          "trunc_normal_", "zeros_", "ones_", "constant_", "orthogonal_")


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Skip ``torch.nn.init`` while a model is built on the meta device to be counted. A meta tensor has no values,
    so an initializer there does nothing but dispatch to torch's Python reference ops, whose first use imports
    ``torch._dynamo``: about 1.1 s of every report and ``attnres variants --params`` on this machine."""
    import torch.nn.init as init

    saved = {name: getattr(init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(init, name, _unchanged)
        yield
    finally:
        for name, fn in saved.items():
            setattr(init, name, fn)


def _unchanged(tensor: object, *_args: object, **_kwargs: object) -> object:
    return tensor


@functools.lru_cache(maxsize=256)
def model_params(cfg: ModelConfig) -> dict[str, int]:
    """A model's parameter counts (total, non_embedding, residual_extra and the depth split), built on the
    meta device: no memory, whatever the size (and once per shape in a process: every report counts them)."""
    import torch

    from attnres.model.gpt import GPT

    with torch.device("meta"), _no_init():
        model = GPT(cfg)
    split = model.residual.param_counts() if hasattr(model.residual, "param_counts") else {}
    return {**model.num_params(), **split}


def _param_columns(cfg: ModelConfig, reference: dict[str, int]) -> dict[str, str]:
    """A model's depth-attention parameters by job, their sum, the model's total, without its embedding, and
    its difference from control_block's total."""
    params = model_params(cfg)
    row = {key: f"{params[key]:,}" if key in params else "—" for key in PARAM_COLUMNS}
    diff = params["total"] - reference["total"]
    return {**row, "depth": f"{params['residual_extra']:,}", "total": f"{params['total'] / 1e6:,.2f}M",
            "non-embedding": f"{params['non_embedding'] / 1e6:,.2f}M",
            "total vs control_block": f"{diff:+,} ({diff / reference['total']:+.2%})" if diff else "0"}


FLOPS_NOTE = ("Training compute (attnres.model.flops): FLOPs/token is 3 forward passes of 2 FLOPs per weight (the "
              "output head included), causal attention over the context and the depth attention over its sources; "
              "depth: the depth attention's share; train FLOPs: over the preset's steps on one rank, what `attnres "
              "report --scaling` fits against (the trainer records it as train_flops).")


def flops_rows(preset: str, overrides: list[str] | None = None) -> list[dict[str, str]]:
    """Each variant's training compute at ``preset`` (:mod:`attnres.model.flops`): per token, the depth
    attention's part, over the preset's steps, and against standard."""
    from attnres.model.flops import depth_flops_per_token, forward_flops_per_token, training_flops

    rows, base = [], None
    for name in VARIANTS:
        try:
            run = resolve_run(name, preset, 0, overrides)
        except AttnresError:
            continue
        non_embedding = model_params(run.model)["non_embedding"]
        total = training_flops(run, non_embedding)
        base = total if name == "standard" else base
        rows.append({"variant": name, "shape": shape(run.model),
                     "FLOPs/token": f"{3 * forward_flops_per_token(run.model, non_embedding):,}",
                     "depth FLOPs/token": f"{3 * depth_flops_per_token(run.model):,}",
                     "train FLOPs": f"{total:.4g}", "_total": total})
    for row in rows:
        total = row.pop("_total")
        row["vs standard"] = f"{total / base - 1:+.2%}" if base else "—"
    return rows
