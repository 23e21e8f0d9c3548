"""What each variant is made of, as named traits: the facts the report's rules reason over.

A report's Interpretation, its verdict qualifiers ("simpler") and its choice of which two variants
isolate a mechanism are rules over these traits, never over a variant's name. A trait's value is
``None`` where the variant has the plain choice (control_block's: blocks of 3 layers with mean
summaries and a partial state, one query per layer, key gains per layer, no bias, all sources) or no
depth attention at all; otherwise a short phrase saying what it has. Two variants whose traits differ
in one entry isolate that mechanism; more than one, and a comparison of them is confounded.

Each trait also says what its design expects: a mechanism that adds expressiveness is expected to
*help* (lower eval loss); one that saves cost is expected to *cost little* (not raise it). A result of
the other sign, once resolved, contradicts the design's expectation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from attnres.config import ResidualSpec
from attnres.variants.registry import BLOCK, VARIANTS, Variant

HELPS, COSTS_LITTLE = "helps", "costs little"
_PLAIN = BLOCK  # the plain choices: the registry's block spec, which control_block is


@dataclass(frozen=True)
class Trait:
    """One named mechanism: how to read it off a variant, and what its design expects of it."""

    name: str
    label: str  # what the Interpretation calls it
    expects: str  # HELPS or COSTS_LITTLE
    of: Callable[[Variant], str | None]


def _depth(v: Variant) -> ResidualSpec | None:
    return v.residual if v.residual.kind == "depth" else None


def _sources(v: Variant) -> str | None:
    s = _depth(v)
    if s is None:
        return None
    step = "sublayer" if s.granularity == "sublayer" else "layer"
    if s.n_blocks > 0:
        shape = f"{s.n_blocks} blocks of {step}s ({s.reduce}s)"
    elif s.block_size == 1:
        return f"every {step} output individually"
    else:
        shape = f"blocks of {s.block_size} {step}s ({s.reduce}s)"
    plain = (s.granularity, s.n_blocks, s.block_size, s.reduce, s.partial) == \
        (_PLAIN.granularity, _PLAIN.n_blocks, _PLAIN.block_size, _PLAIN.reduce, _PLAIN.partial)
    return None if plain else shape + ("" if s.partial else " without a partial state")


def _query(v: Variant) -> str | None:
    s = _depth(v)
    if s is None or s.query == "site":
        return None
    return f"one query per group of {s.query_group} layers" if s.query == "group" else \
        "one query for every layer and the readout"


def _when(test: Callable[[ResidualSpec], bool],
          words: Callable[[ResidualSpec], str]) -> Callable[[Variant], str | None]:
    def read(v: Variant) -> str | None:
        s = _depth(v)
        return words(s) if s is not None and test(s) else None
    return read


TRAITS: list[Trait] = [
    Trait("depth_attention", "depth attention instead of the residual sum", HELPS,
          lambda v: "depth attention" if _depth(v) is not None else None),
    Trait("sources", "source granularity", HELPS, _sources),
    Trait("window", "memory window", HELPS,
          _when(lambda s: s.window > 0, lambda s: f"a window of the {s.window} most recent layer outputs")),
    Trait("query_sharing", "query sharing", COSTS_LITTLE, _query),
    Trait("key_gain", "key gains per depth position", COSTS_LITTLE,
          _when(lambda s: s.key_gain == "source", lambda s: "key gains owned by the depth position, not the layer")),
    Trait("input_query", "input-dependent queries", HELPS,
          _when(lambda s: s.query_rank > 0, lambda s: f"an input-dependent query (rank {s.query_rank})")),
    Trait("alibi", "depth encoding (ALiBi)", HELPS,
          _when(lambda s: s.alibi, lambda s: "a learned linear bias on block distance")),
    Trait("rope", "depth encoding (RoPE)", HELPS,
          _when(lambda s: s.rope, lambda s: "rotary encoding of depth position")),
    Trait("sparse", "sparse sources", COSTS_LITTLE,
          _when(lambda s: s.sparse_near > 0,
                lambda s: f"only the {s.sparse_near} nearest blocks and every {s.sparse_stride}th older one")),
    Trait("value_proj", "value projection", HELPS,
          _when(lambda s: s.value_proj, lambda s: "a learned value projection of block summaries")),
    Trait("deep", "depth at matched parameters", HELPS,
          lambda v: f"{v.depth_mult}x the layers at {v.width_ratio:.0%} of the width" if v.depth_mult > 1 else None),
]
BY_NAME: dict[str, Trait] = {t.name: t for t in TRAITS}


def traits_of(name: str) -> dict[str, str]:
    """A registry variant's traits that are not the plain choice: trait name -> what it has."""
    v = VARIANTS[name]
    return {t.name: value for t in TRAITS if (value := t.of(v)) is not None}


def deep_variants() -> list[str]:
    """The variants reshaped to more layers at matched parameters: compared with the (wide) baseline apart."""
    return [n for n in VARIANTS if "deep" in traits_of(n)]


def mechanisms(name: str) -> int:
    """How many mechanisms a variant adds to plain depth attention (0 for control_block and standard)."""
    return len([t for t in traits_of(name) if t != "depth_attention"])


def contrasts(names: list[str]) -> list[tuple[str, str, list[str]]]:
    """Pairs that isolate mechanisms: (variant, reference, the traits the variant adds).

    For each variant, its references are the variants among ``names`` whose traits it has all of, with
    the same values, plus the fewest others (at least one). A pair adding one trait is a clean ablation;
    more, and the traits it adds are confounded (named, never split).
    """
    known = [n for n in names if n in VARIANTS]
    have: Mapping[str, dict[str, str]] = {n: traits_of(n) for n in known}
    out = []
    for v in known:
        refs = [(r, [t for t in have[v] if t not in have[r]]) for r in known if r != v
                and all(have[v].get(t) == value for t, value in have[r].items())]
        refs = [(r, added) for r, added in refs if added]
        if refs:
            fewest = min(len(a) for _, a in refs)
            out += [(v, r, added) for r, added in refs if len(added) == fewest]
    return out
