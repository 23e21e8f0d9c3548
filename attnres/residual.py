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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnres.config import ResidualSpec

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
    """One candidate for depth attention: its tensor, depth position and role."""

    value: Tensor
    pos: int  # 0 = embedding, k = k-th block (1-based)
    kind: str  # "embedding" | "block" | "partial" | "window"


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
    """

    def __init__(self, spec: ResidualSpec, d_model: int, n_steps: int, eps: float) -> None:
        super().__init__()
        self.spec, self.eps, self.n_steps = spec, eps, n_steps
        self.block_size = spec.blocks_for(n_steps)
        self.n_sites = n_steps + 1
        self.n_pos = math.ceil(n_steps / self.block_size) + 1
        n_query = {"site": self.n_sites, "group": math.ceil(self.n_sites / spec.query_group), "shared": 1}
        self.query = nn.Parameter(torch.zeros(n_query[spec.query], d_model))
        n_gain = self.n_sites if spec.key_gain == "site" else self.n_pos
        self.key_gain = nn.Parameter(torch.ones(n_gain, d_model))
        if spec.alibi:
            self.alibi_slope = nn.Parameter(torch.zeros(self.n_sites))
        if spec.query_rank:
            r = spec.query_rank
            self.query_down = nn.Parameter(torch.randn(self.n_sites, d_model, r) / math.sqrt(d_model))
            self.query_up = nn.Parameter(torch.zeros(self.n_sites, r, d_model))
        if spec.value_proj:
            self.value_delta = nn.Parameter(torch.zeros(d_model, d_model))
        if spec.rope:
            inv = 1.0 / (10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float32) / d_model))
            self.register_buffer("rope_inv_freq", inv, persistent=False)
        self.record = False
        self.records: list[SiteRecord] = []

    # -- which sources a site sees -------------------------------------------------------------
    def _query_index(self, site: int) -> int:
        return {"site": site, "group": site // self.spec.query_group, "shared": 0}[self.spec.query]

    def _allowed(self, site_pos: int, pos: int) -> bool:
        s = self.spec
        if not s.sparse_near:
            return True
        return site_pos - pos <= s.sparse_near or pos % s.sparse_stride == 0

    def _sources(self, site: int, emb: Tensor, blocks: list[Tensor], partial: Tensor | None,
                 window: deque[tuple[Tensor, int]]) -> tuple[list[Source], int]:
        site_pos = site // self.block_size + 1
        out = [Source(emb, 0, "embedding")]
        out += [Source(b, k + 1, "block") for k, b in enumerate(blocks)]
        out = [s for s in out if self._allowed(site_pos, s.pos)]
        if partial is not None:
            out.append(Source(partial, site_pos, "partial"))
        out += [Source(v, p, "window") for v, p in reversed(window)]  # newest first
        return out, site_pos

    # -- scoring ------------------------------------------------------------------------------
    def _rope(self, x: Tensor, pos: Tensor) -> Tensor:
        """Rotate pairs of channels of ``x`` (..., D) by angle pos * inv_freq; pos broadcasts."""
        ang = pos[..., None].float() * self.rope_inv_freq  # (..., D/2)
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def _mix(self, site: int, sources: list[Source], site_pos: int, state: Tensor) -> Tensor:
        s = self.spec
        raw = torch.stack([src.value for src in sources])  # (S, B, T, D)
        positions = [src.pos for src in sources]
        pos = torch.tensor(positions, device=raw.device)
        with torch.autocast(device_type="cuda" if raw.is_cuda else "cpu", enabled=False):
            keys = raw.float()
            keys = keys * torch.rsqrt(keys.pow(2).mean(-1, keepdim=True) + self.eps)
            if s.key_gain == "source":
                keys = keys * self.key_gain[pos][:, None, None, :].float()
            else:
                keys = keys * self.key_gain[site].float()
            q = self.query[self._query_index(site)].float()  # (D,)
            if s.query_rank:
                h = state.float()
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
                q = q + (h @ self.query_down[site].float()) @ self.query_up[site].float()  # (B,T,D)
            if s.rope:
                keys = self._rope(keys, pos[:, None, None])
                q = self._rope(q, torch.tensor(site_pos, device=raw.device))
            logits = (keys * q).sum(-1)  # (S, B, T); no 1/sqrt(d), as in the paper
            if s.alibi:
                logits = logits - self.alibi_slope[site].float() * (site_pos - pos).float()[:, None, None]
            weights = torch.softmax(logits, dim=0)
        values = raw
        if s.value_proj:
            is_block = torch.tensor([src.kind == "block" for src in sources], device=raw.device)
            projected = raw + F.linear(raw, self.value_delta)
            values = torch.where(is_block[:, None, None, None], projected, raw)
        if self.record:
            self.records.append(SiteRecord(site, [x.kind for x in sources], positions,
                                           weights.detach(), [x.value.detach() for x in sources]))
        return torch.einsum("sbt,sbtd->btd", weights.to(values.dtype), values)

    # -- the depth loop -----------------------------------------------------------------------
    def _reduce(self, total: Tensor, count: int) -> Tensor:
        return total / count if self.spec.reduce == "mean" else total

    def forward(self, emb: Tensor, steps: Sequence[Step]) -> Tensor:
        assert len(steps) == self.n_steps, "residual built for a different depth"
        self.records = []
        blocks: list[Tensor] = []
        window: deque[tuple[Tensor, int]] = deque(maxlen=self.spec.window or None)
        total: Tensor | None = None
        count = 0
        state = emb  # the standard-residual running state, for input-dependent queries
        for i in range(self.n_steps + 1):
            partial = self._reduce(total, count) if (total is not None and self.spec.partial) else None
            sources, site_pos = self._sources(i, emb, blocks, partial, window if self.spec.window else deque())
            x = self._mix(i, sources, site_pos, state)
            if i == self.n_steps:
                return x
            v = steps[i](x)
            state = x + v
            total = v if total is None else total + v
            count += 1
            if self.spec.window:
                window.append((v, site_pos))
            if count == self.block_size:
                blocks.append(self._reduce(total, count))
                total, count = None, 0
        raise AssertionError("unreachable")


RESIDUALS: dict[str, type[nn.Module]] = {"standard": StandardResidual, "depth": DepthAttention}


def build_residual(spec: ResidualSpec, d_model: int, n_steps: int, eps: float) -> nn.Module:
    """Instantiate the residual module that a spec names."""
    return RESIDUALS[spec.kind](spec, d_model, n_steps, eps)
