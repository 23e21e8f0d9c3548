"""The residual path: how a stack of depth steps is combined into each step's input.

The model hands the residual module the embedding and a list of *steps* (callables that map a
hidden state to an output: a whole layer, or one sublayer). The residual module decides what
each step sees. :class:`StandardResidual` is ``x = x + f(x)``; :class:`DepthAttention` is
AttnRes: each step's input is a per-token softmax over depth of a set of source tensors, chosen
and scored according to a :class:`ResidualSpec`. Depth attention never mixes token positions,
so causality of the sequence model is untouched.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnres.config import ResidualSpec
from attnres.model.depth_attend import attend, rms_rsqrt

Step = Callable[[Tensor], Tensor]


class StandardResidual(nn.Module):
    """``x = x + f(x)`` for every step."""

    def __init__(self, spec: ResidualSpec, d_model: int, n_steps: int, eps: float) -> None:
        super().__init__()

    def forward(self, emb: Tensor, steps: Sequence[Step]) -> Tensor:
        h = emb
        for f in steps:
            h = h + f(h)
        return h


@dataclass
class Source:
    """One candidate for depth attention: its tensor (token-major), depth position and role.

    ``rs`` is its RMS statistic, computed once when the source is made (see ``depth_attend``);
    ``value`` differs from ``key`` only for projected block summaries.
    """

    key: Tensor
    pos: int  # 0 = embedding, k = k-th block (1-based)
    kind: str  # "embedding" | "block" | "partial" | "window"
    rs: Tensor
    value: Tensor | None = None
    scale: float = 1.0  # the source is scale * key (a mean kept as a sum)


@dataclass
class SiteRecord:
    """What one site attended to; kept only when ``record`` is on (tests and analysis)."""

    site: int
    kinds: list[str]
    positions: list[int]
    weights: Tensor  # (S, B, T) float32, detached
    sources: list[Tensor]


class DepthAttention(nn.Module):
    """AttnRes depth attention over block representations, configured by a ResidualSpec.

    Sites are the inputs of every step plus the input of the final norm (``n_steps + 1``).
    A site inside block ``n`` (0-based) sits at depth position ``n + 1``; the embedding is at
    position 0 and the ``k``-th completed block at position ``k``.

    The sites of one block share their completed sources, so they are attended together in one
    kernel call when the block starts (their queries do not depend on the input). Each site then
    merges its own sources (the block's partial state, the window) by an online-softmax update.
    See :mod:`attnres.model.depth_attend` for what is saved for backward.
    """

    #: What each parameter is, for the optimizer's weight-decay groups (attnres.training.optim): vectors that
    #: steer the softmax are not decayed, weight matrices are.
    PARAM_ROLES: ClassVar[dict[str, str]] = {
        "query": "query", "key_gain": "key_gain", "alibi_slope": "alibi_slope",
        "query_down": "query_factor", "query_up": "query_factor", "value_delta": "value_proj",
    }

    def __init__(self, spec: ResidualSpec, d_model: int, n_steps: int, eps: float) -> None:
        super().__init__()
        self.spec, self.eps, self.n_steps = spec, eps, n_steps
        self.block_size = spec.blocks_for(n_steps)
        self.n_sites = n_steps + 1  # every step's input, and the readout before the final norm
        self.n_pos = math.ceil(n_steps / self.block_size) + 1
        # grouped queries: one per group of query_group steps, and one for the readout
        n_query = {"site": self.n_sites, "group": math.ceil(n_steps / spec.query_group) + 1, "shared": 1}
        self.query = nn.Parameter(torch.zeros(n_query[spec.query], d_model))
        n_gain = self.n_sites if spec.key_gain == "site" else self.n_pos
        self.key_gain = nn.Parameter(torch.ones(n_gain, d_model))
        if spec.alibi:
            self.alibi_slope = nn.Parameter(torch.zeros(self.n_sites))
        if spec.query_rank:
            r = spec.query_rank
            # N(0, 1/d) through nn.init, so that a parameter count on the meta device can skip it
            self.query_down = nn.Parameter(nn.init.normal_(torch.empty(self.n_sites, d_model, r), std=d_model**-0.5))
            self.query_up = nn.Parameter(torch.zeros(self.n_sites, r, d_model))
        if spec.value_proj:
            self.value_delta = nn.Parameter(torch.zeros(d_model, d_model))
        if spec.rope:
            # base = the number of depth positions: channel pair j turns n_pos^(-2j/d) rad per block,
            # from 1 rad down to 1/n_pos, so even the slowest pair turns ~1 rad across the whole depth
            # (with the token RoPE's base 10000 most pairs would barely turn over ~17 positions)
            base = float(max(self.n_pos, 2))
            # (counted on the CPU: see attnres.model.gpt.rope_tables on arange and the meta device)
            cpu = torch.device("cpu")
            inv = 1.0 / (base ** (torch.arange(0, d_model, 2, dtype=torch.float32, device=cpu) / d_model))
            inv = inv.to(torch.get_default_device())
            self.register_buffer("rope_inv_freq", inv, persistent=False)
        self.record = False
        self.records: list[SiteRecord] = []
        self.tally: dict[tuple[int, str], list[float]] | None = None  # see :meth:`tally_maps`

    # -- queries, gains and biases --------------------------------------------------------------
    def _query_index(self, site: int) -> int:
        if self.spec.query == "group":  # the readout (site n_steps) has the last row to itself
            return site // self.spec.query_group if site < self.n_steps else self.query.shape[0] - 1
        return {"site": site, "shared": 0}[self.spec.query]

    def param_counts(self) -> dict[str, int]:
        """Depth-attention parameters by job: the layers' queries, the readout's, key gains, the rest.

        Query rows (and low-rank query factors) are split between the steps' sites and the readout's
        site by the rows those sites use; a row shared by both counts as the steps'.
        """
        step_rows = {self._query_index(i) for i in range(self.n_steps)}
        readout_rows = {self._query_index(self.n_steps)} - step_rows
        per_row = self.query.shape[1]
        if self.spec.query_rank:  # the factors have a row per site
            per_row += self.query_down[0].numel() + self.query_up[0].numel()
        queries = self.query.numel() + (self.query_down.numel() + self.query_up.numel() if self.spec.query_rank else 0)
        readout = per_row * len(readout_rows)
        gains = self.key_gain.numel()
        total = sum(p.numel() for p in self.parameters())
        return {"step queries": queries - readout, "readout query": readout, "key gains": gains,
                "other": total - queries - gains}

    def source_plan(self) -> list[list[tuple[str, int]]]:
        """Per site, the (kind, depth position) of each source it attends to, in the order
        :meth:`forward` gives them (see :meth:`ResidualSpec.source_plan`)."""
        return self.spec.source_plan(self.n_steps)

    def _rotate(self, x: Tensor, dist: Tensor) -> Tensor:
        """Rotate channel pairs of ``x`` (..., D) by ``dist * inv_freq``; ``dist`` (n,) -> (n, ..., D).

        Rotating keys by their position and the query by the site's is the same as rotating the
        query alone by the distance, which is what lets the rotation live in the query.
        """
        ang = dist.to(x.dtype).view(-1, *([1] * (x.dim() - 1)), 1) * self.rope_inv_freq.to(x.dtype)
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def _queries(self, sites: list[int], site_pos: int, positions: list[int],
                 state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Effective queries ``u`` (gain folded in, rotated by distance) and the ALiBi bias.

        Shapes as :func:`attend` takes them: (1 or n, S, D), or per token (1 or n, N, D).
        """
        s = self.spec
        q = _rows(self.query, [self._query_index(i) for i in sites])  # (S, D)
        if s.query_rank:  # input-dependent: one site, a query per token
            h = state * torch.rsqrt(state.pow(2).mean(-1, keepdim=True) + self.eps)
            q = q + (h @ self.query_down[sites[0]]) @ self.query_up[sites[0]]  # (N, D)
        dist = None
        if s.rope or s.alibi or s.key_gain == "source":
            pos = torch.tensor(positions, device=q.device)
            dist = site_pos - pos
        q = self._rotate(q, dist) if s.rope else q[None]  # (n or 1, S|N, D)
        if s.key_gain == "source":
            gain = self.key_gain[pos][:, None, :]  # (n, 1, D)
        else:
            gain = _rows(self.key_gain, sites)[None] if not s.query_rank else self.key_gain[sites[0]][None, None]
        bias = None
        if s.alibi:
            bias = -_rows(self.alibi_slope, sites)[None, :] * dist[:, None].to(q.dtype)  # (n, S)
        return gain * q, bias

    # -- the depth loop -----------------------------------------------------------------------
    def _source(self, key: Tensor, pos: int, kind: str, scale: float = 1.0) -> Source:
        value = None
        if kind == "block" and self.spec.value_proj:
            kv = key * scale
            value = kv + F.linear(kv, self.value_delta.to(key.dtype))
        return Source(key, pos, kind, rms_rsqrt(key, self.eps, scale), value, scale)

    def _attend(self, sources: list[Source], sites: list[int], site_pos: int, state: Tensor | None,
                prior: tuple[Tensor, Tensor] | None = None) -> tuple[list[Tensor], Tensor, Tensor]:
        u, bias = self._queries(sites, site_pos, [src.pos for src in sources], state)
        values = [src.value if src.value is not None else src.key for src in sources]
        projected = any(src.value is not None for src in sources)
        scaled = any(src.scale != 1.0 for src in sources)
        return attend([src.key for src in sources], u, [src.rs for src in sources],
                      values=values if projected else None, bias=bias, per_token=bool(self.spec.query_rank),
                      prior=prior, scales=[src.scale for src in sources] if scaled else None,
                      value_scales=[1.0 if src.value is not None else src.scale for src in sources] if scaled else None)

    def _scale(self, count: int) -> float:
        """A block's representation is its outputs' sum times this (1/count for a mean)."""
        return 1.0 / count if self.spec.reduce == "mean" else 1.0

    def tally_maps(self) -> None:
        """Start summing each site's mean weight per source over the forward passes that follow
        (evals: see :meth:`depth_map`)."""
        self.tally = {}

    def depth_map(self) -> dict[tuple[int, str], float]:
        """The tallied map: (site, source label) -> mean softmax weight over the tokens seen; stops tallying."""
        tally, self.tally = self.tally or {}, None
        return {k: total / n for k, (total, n) in tally.items()}

    def _record(self, site: int, srcs: list[Source], weights: Tensor, shape: torch.Size) -> None:
        """Keep the weights (N, S) a site gave its sources, for tests and analysis; or tally their means."""
        if self.tally is not None:
            means = weights.detach().float().mean(0).tolist()
            for label, mean in zip(source_labels(srcs), means, strict=True):
                acc = self.tally.setdefault((site, label), [0.0, 0])
                acc[0] += mean
                acc[1] += 1
            return
        self.records.append(SiteRecord(site, [x.kind for x in srcs], [x.pos for x in srcs],
                                       weights.float().t().reshape(len(srcs), *shape[:-1]),
                                       [(x.key.detach() * x.scale).view(shape) for x in srcs]))

    def forward(self, emb: Tensor, steps: Sequence[Step]) -> Tensor:
        """Run the steps, each on its depth-attention input; return the readout's input.

        Under autocast the depth path itself runs in float32 (logits, softmax, block and partial
        sums, value projection and the mix), as the standard residual stream does; only the steps
        run in the autocast dtype, and each step's output is made float32 once, as it leaves it.
        """
        assert len(steps) == self.n_steps, "residual built for a different depth"
        dev = emb.device.type
        if not torch.amp.is_autocast_available(dev) or not torch.is_autocast_enabled(dev):
            return self._forward(emb, steps, nullcontext)  # e.g. the meta device of `attnres variants`
        dtype = torch.get_autocast_dtype(dev)
        with torch.autocast(dev, enabled=False):
            return self._forward(emb, steps, lambda: torch.autocast(dev, dtype=dtype))

    def _forward(self, emb: Tensor, steps: Sequence[Step], in_layer: Callable[[], AbstractContextManager]) -> Tensor:
        self.records = []
        shape = emb.shape
        flat = emb.reshape(-1, shape[-1])
        completed = [self._source(flat, 0, "embedding")]
        window: deque[Source] = deque(maxlen=self.spec.window or None)
        total: Tensor | None = None
        count = 0
        state = flat  # the standard-residual running state, for input-dependent queries
        i = 0
        while i <= self.n_steps:
            site_pos = i // self.block_size + 1
            # the sites that share these completed sources: the rest of the block (+ the final norm)
            end = min(site_pos * self.block_size, self.n_steps + 1) if not self.spec.query_rank else i + 1
            sites = list(range(i, end))
            shared = [src for src in completed if self.spec.allowed(site_pos, src.pos)]
            if len(sites) > 1:
                outs, lses, weights = self._attend(shared, sites, site_pos, state)
            for j, site in enumerate(sites):
                own = ([self._source(total, site_pos, "partial", self._scale(count))]
                       if total is not None and self.spec.partial else [])
                own += list(reversed(window))  # newest first
                if len(sites) == 1:  # nothing to share: one call over all of the site's sources
                    (x,), _, w = self._attend(shared + own, sites, site_pos, state)
                elif own:  # merge the site's own sources into its shared result
                    (x,), _, w = self._attend(own, [site], site_pos, state, prior=(outs[j], lses[:, j]))
                else:
                    x, w = outs[j], None
                if self.record or self.tally is not None:
                    self._record(site, shared + own, _site_weights(w, weights[:, :, j] if len(sites) > 1 else None),
                                 shape)
                if site == self.n_steps:
                    return x.view(shape).to(emb.dtype)  # a no-op but for a model cast to bf16 as a whole
                with in_layer():
                    v = steps[site](x.view(shape).to(emb.dtype)).reshape(-1, shape[-1])
                # a bf16 output becomes float32 once, here: the sums accumulate in float32, and the
                # gradients of its several readers add up in float32 before the one cast back
                v = v.to(torch.promote_types(v.dtype, torch.float32))
                state = x + v if self.spec.query_rank else state
                total = v if total is None else total + v
                count += 1
                if self.spec.window:
                    window.append(self._source(v, site_pos, "window"))
                if count == self.block_size:
                    completed.append(self._source(total, site_pos, "block", self._scale(count)))
                    total, count = None, 0
            i = end
        raise AssertionError("unreachable")


def source_labels(srcs: Sequence[Source]) -> list[str]:
    """How a depth map names a site's sources: ``embedding``, ``block K``, ``partial``, ``recent J``
    (the J-th newest raw output of the window)."""
    labels, recent = [], 0
    for src in srcs:
        if src.kind == "window":
            recent += 1
            labels.append(f"recent {recent}")
        else:
            labels.append({"embedding": "embedding", "partial": "partial"}.get(src.kind, f"block {src.pos}"))
    return labels


def _site_weights(w: Tensor | None, shared: Tensor | None) -> Tensor:
    """A site's (N, sources) weights from its calls: a merge's prior weight spreads over the shared ones."""
    if shared is None:
        return w[:, :, 0]
    if w is None:
        return shared
    return torch.cat([w[:, :1, 0] * shared, w[:, 1:, 0]], 1)


def _rows(t: Tensor, idx: list[int]) -> Tensor:
    """``t[idx]``, as a view when the indices are consecutive (no index tensor to build)."""
    if idx == list(range(idx[0], idx[0] + len(idx))):
        return t[idx[0]:idx[0] + len(idx)]
    return t[idx]


RESIDUALS: dict[str, type[nn.Module]] = {"standard": StandardResidual, "depth": DepthAttention}


def build_residual(spec: ResidualSpec, d_model: int, n_steps: int, eps: float) -> nn.Module:
    """Instantiate the residual module that a spec names."""
    return RESIDUALS[spec.kind](spec, d_model, n_steps, eps)
