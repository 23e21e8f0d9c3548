"""A plain reference of depth attention: every site stacks its sources and runs ordinary autograd ops.

This is the straightforward implementation (the one the results document ran), kept here, apart
from the product, so that the optimised kernel in ``attnres.model.depth_attend`` can be checked against
it: same parameters, same inputs, forward and gradients equal in float64.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from attnres.model.residual import DepthAttention, Step


def _rope(res: DepthAttention, x: Tensor, pos: Tensor) -> Tensor:
    ang = pos[..., None].to(x.dtype) * res.rope_inv_freq.to(x.dtype)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def _mix(res: DepthAttention, site: int, sources: list[tuple[Tensor, int, str]], site_pos: int,
         state: Tensor) -> Tensor:
    s = res.spec
    raw = torch.stack([v for v, _, _ in sources])  # (S, B, T, D)
    pos = torch.tensor([p for _, p, _ in sources])
    keys = raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True) + res.eps)
    if s.key_gain == "source":
        keys = keys * res.key_gain[pos][:, None, None, :]
    else:
        keys = keys * res.key_gain[site]
    q = res.query[res._query_index(site)]
    if s.query_rank:
        h = state * torch.rsqrt(state.pow(2).mean(-1, keepdim=True) + res.eps)
        q = q + (h @ res.query_down[site]) @ res.query_up[site]
    if s.rope:
        keys = _rope(res, keys, pos[:, None, None])
        q = _rope(res, q, torch.tensor(site_pos))
    logits = (keys * q).sum(-1)
    if s.alibi:
        logits = logits - res.alibi_slope[site] * (site_pos - pos).to(raw.dtype)[:, None, None]
    weights = torch.softmax(logits, dim=0)
    values = raw
    if s.value_proj:
        is_block = torch.tensor([kind == "block" for _, _, kind in sources])
        values = torch.where(is_block[:, None, None, None], raw + F.linear(raw, res.value_delta), raw)
    return torch.einsum("sbt,sbtd->btd", weights, values)


def reference_forward(res: DepthAttention, emb: Tensor, steps: Sequence[Step]) -> Tensor:
    """What ``res(emb, steps)`` computes, written site by site with no optimisation."""
    s, bs = res.spec, res.block_size
    blocks: list[Tensor] = []
    window: deque[tuple[Tensor, int]] = deque(maxlen=s.window or None)
    total, count, state = None, 0, emb
    for i in range(res.n_steps + 1):
        site_pos = i // bs + 1
        sources = [(emb, 0, "embedding")] + [(b, k + 1, "block") for k, b in enumerate(blocks)]
        sources = [x for x in sources if res.spec.allowed(site_pos, x[1])]
        if total is not None and s.partial:
            sources.append((total / count if s.reduce == "mean" else total, site_pos, "partial"))
        if s.window:
            sources += [(v, p, "window") for v, p in reversed(window)]
        x = _mix(res, i, sources, site_pos, state)
        if i == res.n_steps:
            return x
        v = steps[i](x)
        state = x + v
        total = v if total is None else total + v
        count += 1
        if s.window:
            window.append((v, site_pos))
        if count == bs:
            blocks.append(total / count if s.reduce == "mean" else total)
            total, count = None, 0
    raise AssertionError("unreachable")
