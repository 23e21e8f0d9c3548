"""A compute ladder: model sizes, each trained on a token budget from one stated rule (``attnres scale``).

A size is a width and a depth (``64x4``: d_model 64, 4 layers), optionally with its heads (``64x4x2``); without
them the preset's head width is kept (the tiny preset's 16: d_model 64 gets 4 heads, 96 gets 6). The token
budget of a size is either fixed (``--tokens N``: every size sees the same data) or proportional to the size's
non-embedding parameters (``--tokens-per-param R``, Chinchilla's rule is R ≈ 20). The parameters counted are
the standard residual's at that size, so every variant of a size trains on the same tokens and a variant's
extra depth attention shows in its FLOPs, not in its data. Steps are the budget over the tokens one optimizer
step trains on (sequences per rank × micro-steps × sequence length × ranks), rounded up.

Each size becomes one cell of an ordinary launch (:class:`attnres.runs.planning.LaunchRequest`): its
``d_model``, ``n_layer``, ``n_head`` and ``steps`` move together, where ``--set k=a,b`` would make a product.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from attnres.errors import AttnresError

SIZE = re.compile(r"(\d+)x(\d+)(?:x(\d+))?")
MIN_SIZES = 4  # what a scaling fit needs (reports.scaling.MIN_SIZES): a ladder with fewer is warned about
EXTRAPOLATE_SIZES = 5  # what a multiplier past the ladder needs (2 residual dof: reports.scaling_checks.MIN_DOF)
MAX_TOKENS = 10**18  # a budget past any ladder's (and past what a step count can hold)
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}


def parse_tokens(value: str | None) -> int | None:
    """``--tokens`` as a whole number of tokens: ``2000000``, ``2e6``, ``2M`` or ``500k``."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbg]?)\s*", value.lower())
    tokens = float(match[1]) * _SUFFIX[match[2]] if match else math.nan
    if not 1 <= tokens <= MAX_TOKENS:
        raise AttnresError(f"bad --tokens '{value}': a number of tokens from 1 to 1e18, e.g. --tokens 2000000, 2e6 "
                           "or 2M")
    return round(tokens)


def warning(sizes: list[Size]) -> str | None:
    """What the user should hear before a ladder too short to fit, or to extrapolate from, trains."""
    if len(sizes) >= EXTRAPOLATE_SIZES:
        return None
    if len(sizes) >= MIN_SIZES:
        return (f"{len(sizes)} sizes leave a scaling law {len(sizes) - 3} residual degree of freedom: `report "
                f"--scaling` fits it, but gives no multiplier past the ladder's largest compute before "
                f"{EXTRAPOLATE_SIZES} sizes (add sizes, or launch more later into the same experiment)")
    return (f"{len(sizes)} size{'s' * (len(sizes) != 1)}: a scaling law has three parameters, so `report --scaling` "
            f"fits a variant from {MIN_SIZES} sizes on (add sizes, or launch more later into the same experiment)")


@dataclass(frozen=True)
class Size:
    """One rung's shape."""

    d_model: int
    n_layer: int
    n_head: int | None = None  # None: the preset's head width decides

    @property
    def label(self) -> str:
        return f"{self.d_model}x{self.n_layer}" + (f"x{self.n_head}" if self.n_head else "")


def parse_sizes(specs: list[str]) -> list[Size]:
    """``--sizes`` values (``32x2 64x4``, or comma lists) as sizes; one clear line for a malformed or repeated one."""
    sizes: list[Size] = []
    for spec in (s for value in specs for s in re.split(r"[,\s]+", value) if s):
        match = SIZE.fullmatch(spec.lower())
        if not match or int(match[1]) < 1 or int(match[2]) < 1 or (match[3] is not None and int(match[3]) < 1):
            hint = " (variants go before --sizes)" if spec[:1].isalpha() else ""
            raise AttnresError(f"bad size '{spec}': a size is WIDTHxLAYERS[xHEADS] with whole numbers of at "
                               f"least 1, e.g. --sizes 32x2 64x4 96x4 128x6{hint}")
        size = Size(int(match[1]), int(match[2]), int(match[3]) if match[3] else None)
        if any((s.d_model, s.n_layer) == (size.d_model, size.n_layer) for s in sizes):
            raise AttnresError(f"--sizes names {size.d_model}x{size.n_layer} twice")
        sizes.append(size)
    if not sizes:
        raise AttnresError("--sizes needs at least one size, e.g. --sizes 32x2 64x4 96x4 128x6")
    return sizes


def heads(size: Size, preset_d_model: int, preset_heads: int) -> int:
    """The size's heads: as given, else its width over the preset's head width (one line when it does not divide)."""
    if size.n_head is not None:
        if size.d_model % size.n_head:
            raise AttnresError(f"size {size.label}: {size.n_head} heads do not divide d_model {size.d_model}")
        return size.n_head
    head_dim = preset_d_model // preset_heads
    if size.d_model % head_dim:
        raise AttnresError(f"size {size.label}: d_model {size.d_model} is not a multiple of the preset's head width "
                           f"{head_dim}; give the heads: {size.d_model}x{size.n_layer}xHEADS")
    return size.d_model // head_dim


@dataclass(frozen=True)
class TokenRule:
    """How many tokens a size trains on: ``tokens`` fixed, or ``per_param`` × its non-embedding parameters."""

    tokens: int | None = None
    per_param: float | None = None

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.per_param is None):
            raise AttnresError("a ladder needs one token rule: --tokens N (every size) or --tokens-per-param R")
        if self.tokens is not None and self.tokens < 1:
            raise AttnresError(f"--tokens {self.tokens}: give a positive number of tokens")
        if self.per_param is not None and not (math.isfinite(self.per_param) and 0 < self.per_param <= 1e9):
            raise AttnresError(f"--tokens-per-param {self.per_param}: give a positive number up to 1e9")

    def budget(self, non_embedding: int) -> int:
        if self.tokens is not None:
            return self.tokens
        tokens = self.per_param * non_embedding
        if not tokens <= MAX_TOKENS:
            raise AttnresError(f"--tokens-per-param {self.per_param:g} gives {tokens:.3g} tokens to a size of "
                               f"{non_embedding:,} parameters: more than {MAX_TOKENS:.0e}")
        return max(1, math.ceil(tokens))


@dataclass(frozen=True)
class Rung:
    """One size as a launch cell: its settings (d_model, n_layer, n_head, steps) and what they came from."""

    size: Size
    settings: dict[str, str]
    non_embedding: int
    tokens: int


def rungs(sizes: list[Size], rule: TokenRule, preset: str, overrides: list[str], world: int = 1) -> list[Rung]:
    """Each size's cell: its shape, and the steps that train it on the rule's tokens (``world``: ranks per run)."""
    from attnres.model.flops import tokens_per_step
    from attnres.variants.describe import model_params
    from attnres.variants.registry import resolve_run

    base = resolve_run("standard", preset, 0, overrides)
    out = []
    for size in sizes:
        shape = [f"d_model={size.d_model}", f"n_layer={size.n_layer}",
                 f"n_head={heads(size, base.model.d_model, base.model.n_head)}"]
        cfg = resolve_run("standard", preset, 0, [*overrides, *shape])
        non_embedding = model_params(cfg.model)["non_embedding"]
        tokens = rule.budget(non_embedding)
        steps = max(1, math.ceil(tokens / tokens_per_step(cfg, world)))
        settings = dict(item.split("=", 1) for item in shape) | {"steps": str(steps)}
        out.append(Rung(size, settings, non_embedding, tokens))
    return out
