"""Configuration dataclasses and the named preset registry.

A run is fully described by a :class:`RunConfig` (model + training). It is resolved from three
layers, each overriding the one before: a preset (sizes and schedule), a variant (the residual
path, and for the deep variants a change of shape), then ``--set key=value`` overrides. The
resolved config is stored with every run, so a report can always say what was trained.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args, get_origin, get_type_hints

from attnres.errors import AttnresError, unknown

#: what an experiment may be called (a folder name, a mirror's experiment, a report's scope)
EXPERIMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

# A seed every part of a run takes: torch.manual_seed and numpy's generators (the loader's) take 0 to 2**32 - 1,
# the runs table's seed column (INTEGER: 32-bit signed in PostgreSQL) 2**31 - 1 at most. One rule for every seed
# attnres is given: `launch --seeds`, `scale --seeds` and an imported file's seed column.
SEED_MAX = 2**31 - 1
SEED_RULE = f"a seed is a whole number from 0 to {SEED_MAX}"


def is_seed(value: object) -> bool:
    """Whether ``value`` is a seed by :data:`SEED_RULE` (an int, not a bool, from 0 to :data:`SEED_MAX`)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SEED_MAX


@dataclass(frozen=True)
class ResidualSpec:
    """How the residual stream combines depth steps; one instance per variant.

    ``kind="standard"`` is ``x = x + f(x)``. ``kind="depth"`` builds each step's input by softmax
    attention, per token, over *sources*: the embedding, completed block representations, the
    current block's partial state and a window of recent raw outputs. The other fields select the
    source set, the query, the keys and any bias, so every AttnRes variant is data, not code.
    """

    kind: Literal["standard", "depth"] = "standard"
    granularity: Literal["layer", "sublayer"] = "layer"  # a depth step = a layer or a sublayer
    block_size: int = 1  # depth steps per block (1 = every output is its own source)
    n_blocks: int = 0  # if > 0, block_size = ceil(steps / n_blocks) (the paper's N)
    reduce: Literal["mean", "sum"] = "mean"  # block representation from its outputs
    partial: bool = True  # attend to the current block's partial state
    window: int = 0  # also attend to this many most recent raw outputs
    query: Literal["site", "group", "shared"] = "site"  # who owns a query vector
    query_group: int = 1  # sites per query when query == "group"
    query_rank: int = 0  # > 0: input-dependent low-rank query modulation of this rank
    key_gain: Literal["site", "source"] = "site"  # RMSNorm gain per site or per depth position
    alibi: bool = False  # learned linear penalty on depth distance
    rope: bool = False  # rotary encoding of depth position on queries and keys
    sparse_near: int = 0  # > 0: attend only to this many nearest blocks ...
    sparse_stride: int = 0  # ... plus every stride-th older block
    value_proj: bool = False  # learned projection of completed block representations

    def blocks_for(self, n_steps: int) -> int:
        """Depth steps per block for a model with ``n_steps`` depth steps."""
        if self.n_blocks > 0:
            return max(1, math.ceil(n_steps / self.n_blocks))
        return self.block_size

    def source_plan(self, n_steps: int) -> list[list[tuple[str, int]]]:
        """Per site (every step's input, then the readout), the (kind, depth position) of each source
        it attends to, in the order the residual module gives them; worked out without tensors, so
        ``attnres variants`` needs no model ([] for the standard residual)."""
        if self.kind != "depth":
            return []
        block_size = self.blocks_for(n_steps)
        plan: list[list[tuple[str, int]]] = []
        completed: list[tuple[str, int]] = [("embedding", 0)]
        window: deque[tuple[str, int]] = deque(maxlen=self.window or None)
        count = 0
        for site in range(n_steps + 1):
            site_pos = site // block_size + 1
            shared = [src for src in completed if self.allowed(site_pos, src[1])]
            own = [("partial", site_pos)] if count and self.partial else []
            plan.append(shared + own + list(reversed(window)))
            count += 1
            if self.window:
                window.append(("window", site_pos))
            if count == block_size:
                completed.append(("block", site_pos))
                count = 0
        return plan

    def allowed(self, site_pos: int, pos: int) -> bool:
        """Whether a site at depth ``site_pos`` attends to the completed source at ``pos`` (sparse variants)."""
        if not self.sparse_near:
            return True
        return site_pos - pos <= self.sparse_near or pos % self.sparse_stride == 0


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the GPT-style decoder (nanoGPT's GPTConfig, with RoPE/SwiGLU/RMSNorm)."""

    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    seq_len: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 64
    mlp_multiple_of: int = 32  # SwiGLU hidden = 8/3 d rounded up to this (llama convention)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    residual: ResidualSpec = field(default_factory=ResidualSpec)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def depth_steps(self) -> int:
        """Steps the residual module combines: a layer each, or each layer's two sublayers."""
        return self.n_layer * (2 if self.residual.granularity == "sublayer" else 1)

    @property
    def mlp_hidden(self) -> int:
        m = self.mlp_multiple_of
        return m * math.ceil(int(8 * self.d_model / 3) / m)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and bookkeeping of one run."""

    steps: int = 200
    batch_size: int = 16  # sequences per rank per micro-step
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 25
    eval_batches: int = 8
    log_every: int = 5
    checkpoint_every: int = 0  # every N steps; 0 = at each eval. Always at the end and on preemption (SIGTERM)
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    compile: bool = False  # torch.compile on any device (CUDA runs compile anyway, unless compile_cuda is off)
    compile_cuda: bool = True  # `--set compile=false` turns this off too: the opt-out of compiling on CUDA


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's result: recorded with the run, hashed for de-dup.

    ``revision`` is the variant's revision in the registry when the run was made: a change of what
    a variant trains (not of its config) bumps it, so runs from before are different cells.
    """

    variant: str
    preset: str
    seed: int
    model: ModelConfig
    train: TrainConfig
    data: str = "builtin"
    revision: int = 1
    experiment: str = ""  # "" = the preset's name (what reports group by)

    @property
    def experiment_name(self) -> str:
        """The experiment a run belongs to: named at launch, else its preset."""
        return self.experiment or self.preset

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        if d["revision"] == 1:  # runs recorded before revisions existed keep their hash
            del d["revision"]
        if not d["experiment"]:  # the same for runs in their preset's default experiment
            del d["experiment"]
        if d["train"]["compile_cuda"]:  # the same for runs that compile on CUDA as CUDA runs now do
            del d["train"]["compile_cuda"]
        return json.dumps(d, sort_keys=True)

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        model = dict(d["model"])
        model["residual"] = ResidualSpec(**model["residual"])
        return cls(
            variant=d["variant"], preset=d["preset"], seed=d["seed"], data=d.get("data", "builtin"),
            model=ModelConfig(**model), train=TrainConfig(**d["train"]), revision=d.get("revision", 1),
            experiment=d.get("experiment", ""),
        )


@dataclass(frozen=True)
class Preset:
    """A named size: model shape and training schedule (litgpt-style registry entry)."""

    name: str
    description: str
    model: ModelConfig
    train: TrainConfig
    deepened_from: str | None = None  # a deep shape of this preset: deep_* variants must not deepen it again


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "tiny", "CPU smoke size: 4L d64, seconds per run",
            ModelConfig(n_layer=4, d_model=64, n_head=4, seq_len=64),
            TrainConfig(steps=200, batch_size=16, lr=3e-3, warmup=20, eval_every=25),
        ),
        Preset(
            "small", "CPU minutes: 12L d256",
            ModelConfig(n_layer=12, d_model=256, n_head=4, seq_len=256),
            TrainConfig(steps=2000, batch_size=16, lr=1e-3, warmup=100, eval_every=100,
                        eval_batches=16, log_every=10),
        ),
        Preset(
            "bench", "CPU speed benches: 12L d512, vocab 512 (the layers, not the vocabulary, dominate a "
            "step), the paper's 1024-token context, one sequence per step",
            ModelConfig(n_layer=12, d_model=512, n_head=8, seq_len=1024, vocab_size=512),
            TrainConfig(steps=200, batch_size=1, lr=1e-3, warmup=20, eval_every=50),
        ),
        Preset(
            "paper500m", "the results document's 24L d1536 model on FineWeb-Edu",
            ModelConfig(n_layer=24, d_model=1536, n_head=12, seq_len=1024, mlp_multiple_of=256),
            TrainConfig(steps=19073, batch_size=16, lr=6e-4, warmup=700, eval_every=250,
                        eval_batches=40, log_every=10, checkpoint_every=1000),
        ),
        Preset(
            "deep48", "the results document's 48L d1080 model (same parameters as paper500m), for "
            "shallow variants at that shape; the deep_* variants reach it from paper500m",
            ModelConfig(n_layer=48, d_model=1080, n_head=12, seq_len=1024, mlp_multiple_of=256),
            TrainConfig(steps=19073, batch_size=16, lr=6e-4, warmup=700, eval_every=250,
                        eval_batches=40, log_every=10, checkpoint_every=1000),
            deepened_from="paper500m",
        ),
    ]
}


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A recorded config (nested dicts) as ``{"train.lr": 0.003, "model.residual.kind": ...}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        out.update(flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise unknown("preset", name, PRESETS)
    return PRESETS[name]


def _at_least(low: float) -> tuple[Callable[[float], bool], str]:
    return (lambda v: v >= low), f"at least {low:g}"


_POSITIVE = ((lambda v: v > 0), "more than 0")
_FRACTION = ((lambda v: 0 <= v <= 1), "between 0 and 1")
_BETA = ((lambda v: 0 <= v < 1), "at least 0 and less than 1")

#: the range of every numeric setting; a value outside it is refused when the config is built
LIMITS: dict[str, tuple[Callable[[float], bool], str]] = {
    "vocab_size": _at_least(2), "seq_len": _at_least(1), "n_layer": _at_least(1), "n_head": _at_least(1),
    "d_model": _at_least(2), "mlp_multiple_of": _at_least(1), "rope_theta": _POSITIVE, "norm_eps": _POSITIVE,
    "steps": _at_least(1), "batch_size": _at_least(1), "grad_accum": _at_least(1), "lr": _POSITIVE,
    "min_lr_ratio": _FRACTION, "warmup": _at_least(0), "weight_decay": _at_least(0), "beta1": _BETA,
    "beta2": _BETA, "grad_clip": _at_least(0), "eval_every": _at_least(1), "eval_batches": _at_least(1),
    "log_every": _at_least(1), "checkpoint_every": _at_least(0),
    "block_size": _at_least(1), "n_blocks": _at_least(0), "window": _at_least(0), "query_group": _at_least(1),
    "query_rank": _at_least(0), "sparse_near": _at_least(0), "sparse_stride": _at_least(0),
}


@functools.cache
def _choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """Each Literal field's allowed values, read once per class: a report checks thousands of configs."""
    hints = get_type_hints(cls)
    return {f.name: get_args(hints[f.name]) for f in fields(cls) if get_origin(hints[f.name]) is Literal}


def check(model: ModelConfig, train: TrainConfig) -> None:
    """Refuse, with one line naming the setting, a config that cannot be trained."""
    for obj in (model, train, model.residual):
        allowed = _choices(type(obj))
        for f in fields(obj):
            value = getattr(obj, f.name)
            choices = allowed.get(f.name, ())
            if choices and value not in choices:
                raise AttnresError(f"bad value '{value}' for {f.name}: choose {', '.join(map(str, choices))}")
            if f.name in LIMITS and not isinstance(value, bool):
                ok, rule = LIMITS[f.name]
                if not (math.isfinite(value) and ok(value)):
                    raise AttnresError(f"bad value '{value}' for {f.name}: must be {rule}")
    if model.d_model % model.n_head or model.head_dim % 2:
        raise AttnresError(f"d_model {model.d_model} must be n_head ({model.n_head}) times an even head size "
                           "(rotary position encoding turns channel pairs)")
    if model.residual.rope and model.d_model % 2:
        raise AttnresError(f"depth RoPE turns channel pairs: d_model {model.d_model} must be even")
    if model.residual.sparse_near and not model.residual.sparse_stride:
        raise AttnresError("sparse_near needs sparse_stride of at least 1")


def _coerce(value: str, current: Any, key: str) -> Any:
    """Parse an override string into the type of the field it replaces."""
    try:
        if isinstance(current, bool):
            if value.lower() not in {"true", "false", "1", "0"}:
                raise ValueError(value)
            return value.lower() in {"true", "1"}
        if isinstance(current, int):
            return int(value)
        if isinstance(current, float):
            return float(value)
    except (ValueError, OverflowError):
        raise AttnresError(f"bad value '{value}' for {key}: expected {type(current).__name__}") from None
    return value


def residual_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``overrides`` split in two, order kept: those of the model's shape and training, which a variant's shape
    rule then applies to, and those of its residual (``block_size=4``, ...), which change the variant's wiring."""
    names = {f.name for f in fields(ResidualSpec)}
    wiring = [o for o in overrides if o.partition("=")[0] in names]
    return [o for o in overrides if o not in wiring], wiring


def apply_overrides(model: ModelConfig, train: TrainConfig, overrides: list[str]) -> tuple[ModelConfig, TrainConfig]:
    """Apply ``key=value`` overrides; a key names a field of ModelConfig, TrainConfig or ResidualSpec."""
    groups: dict[str, Any] = {"model": model, "train": train, "residual": model.residual}
    changes: dict[str, dict[str, Any]] = {k: {} for k in groups}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AttnresError(f"bad override '{item}': expected key=value, e.g. n_layer=2")
        owner = next((g for g, obj in groups.items() if key in {f.name for f in fields(obj)}), None)
        if owner is None or key == "residual":
            names = [f.name for obj in groups.values() for f in fields(obj) if f.name != "residual"]
            raise unknown("setting", key, names)
        changes[owner][key] = _coerce(value, getattr(groups[owner], key), key)
    if changes["train"].get("compile") is False:  # compile=false: not on CUDA either (it compiles by default)
        changes["train"].setdefault("compile_cuda", False)
    residual = replace(model.residual, **changes["residual"])
    model, train = replace(model, residual=residual, **changes["model"]), replace(train, **changes["train"])
    check(model, train)
    return model, train
