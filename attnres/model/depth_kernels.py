"""The depth-attention kernel's forward and backward in the fused C and Triton kernels, and what every path
saves for backward (:class:`attnres.model.depth_attend._Attend` picks the path; all compute the same function)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnres.model import cpu_kernel, gpu_kernel


def scale_tensors(scales: tuple | None, like: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """Key and value scales as (1, n, 1) tensors, or None when there are none."""
    if scales is None:
        return None, None
    ks, vs = (torch.tensor(sc, dtype=like.dtype, device=like.device)[None, :, None] for sc in scales)
    return ks, vs


def forward_c(ctx: Any, u: Tensor, rs: Tensor, bias: Tensor | None, prior: Tensor | None,
               prior_lse: Tensor | None, keys: Sequence[Tensor], values: Sequence[Tensor],
               n_sites: int) -> tuple[Tensor, ...]:
    """:class:`_Attend`'s forward in the C kernel; saves the same tensors as the PyTorch path."""
    n, (big_n, d) = len(keys), keys[0].shape
    keys, values = [k.contiguous() for k in keys], [v.contiguous() for v in values]
    u, rs, dt = u.contiguous(), rs.contiguous(), keys[0].dtype
    # converted copies are kept in locals: the C call reads them after this line
    bias, prior, prior_lse, ks, vs = (as_c(t, dt) for t in (bias, prior, prior_lse, *scale_tensors(ctx.scales, rs)))
    outs = [torch.empty_like(keys[0]) for _ in range(n_sites)]
    lse = rs.new_empty(big_n, n_sites)
    w = rs.new_empty(big_n, n + ctx.off, n_sites)
    dots = rs.new_empty(big_n, n, n_sites)
    p, ps = cpu_kernel.ptr, cpu_kernel.ptrs
    ctx.fused[0](big_n, d, n, n_sites, u.shape[0], int(ctx.per_token), ps(keys), ps(values), p(u), p(rs), p(bias),
                 p(ks), p(vs), p(prior), p(prior_lse), ps(outs), p(lse), p(w), p(dots))
    return save(ctx, u, rs, w, dots, keys, values, outs, lse)


def backward_c(ctx: Any, grads: Sequence[Tensor | None]) -> tuple[Tensor | None, ...]:
    """:class:`_Attend`'s backward in the C kernel."""
    n, off = ctx.n, ctx.off
    u, rs, w, dots, keys, values, outs = saved(ctx)
    n_sites, (big_n, d), dt = w.shape[2], keys[0].shape, keys[0].dtype
    g_out = [as_c(g, dt) for g in grads[:n_sites]]
    g_lse = as_c(grads[n_sites], dt)
    ks, vs = (as_c(t, dt) for t in scale_tensors(ctx.scales, rs))
    d_keys = [torch.empty_like(k) for k in keys]
    d_values = [torch.empty_like(v) for v in values] if ctx.has_values else []
    d_u = torch.zeros_like(u)
    d_bias = rs.new_zeros(n, n_sites) if ctx.has_bias else None
    d_prior = torch.empty_like(outs[0]) if off else None
    d_prior_lse = rs.new_empty(big_n) if off else None
    p, ps = cpu_kernel.ptr, cpu_kernel.ptrs
    ctx.fused[1](big_n, d, n, n_sites, u.shape[0], int(ctx.per_token), int(ctx.has_values), ps(keys), ps(values),
                 p(u), p(rs), p(ks), p(vs), p(w), p(dots), off, ps(list(outs) or [None]), ps(g_out), p(g_lse),
                 ps(d_keys), ps(d_values or [None]), p(d_u), p(d_bias), p(d_prior), p(d_prior_lse))
    return (None, None, None, None, d_u, None, d_bias, d_prior, d_prior_lse, *d_keys, *d_values)


def forward_triton(ctx: Any, u: Tensor, rs: Tensor, bias: Tensor | None, prior: Tensor | None,
                    prior_lse: Tensor | None, keys: Sequence[Tensor], values: Sequence[Tensor],
                    n_sites: int) -> tuple[Tensor, ...]:
    """:class:`_Attend`'s forward in the Triton kernel; saves the same tensors as the other paths."""
    ks, vs = (flat(t) for t in scale_tensors(ctx.scales, rs))
    outs, lse, w, dots = gpu_kernel.forward(u, rs, bias, ks, vs, prior, prior_lse, keys, values, n_sites,
                                            ctx.per_token)
    return save(ctx, u, rs, w, dots, keys, values, outs, lse)


def backward_triton(ctx: Any, grads: Sequence[Tensor | None]) -> tuple[Tensor | None, ...]:
    """:class:`_Attend`'s backward in the Triton kernel (the sums over tokens, for the query and the
    bias, from the logits' gradients it gives, as the PyTorch path makes them)."""
    u, rs, w, dots, keys, values, outs = saved(ctx)
    n_sites = w.shape[2]
    g_out = [torch.zeros_like(keys[0]) if g is None else g for g in grads[:n_sites]]  # (the op takes their dtype)
    ks, vs = scale_tensors(ctx.scales, rs)
    d_logit, d_prior, d_prior_lse, d_keys, d_values = gpu_kernel.backward(
        u, rs, w, dots, flat(ks), flat(vs), keys, values, outs, g_out, grads[n_sites], ctx.per_token,
        ctx.has_values, bool(ctx.off))
    alpha = d_logit * rs[:, :, None] if ks is None else d_logit * rs[:, :, None] * ks
    d_bias = d_logit.sum(0) if ctx.has_bias else None
    d_u = query_grad(u, keys, alpha, ctx.iu, ctx.per_token)
    return (None, None, None, None, d_u, None, d_bias, d_prior, d_prior_lse, *d_keys, *d_values)


def query_grad(u: Tensor, keys: Sequence[Tensor], alpha: Tensor, iu: Sequence[int], per_token: bool) -> Tensor:
    """The effective queries' gradient, a sum over tokens: ``alpha`` (N, n, S) is d loss / d (K . u)."""
    d_u = torch.zeros_like(u)
    for k, i in enumerate(iu):
        key = keys[k].to(u.dtype)  # summed over tokens: never in bf16
        if per_token:
            d_u[i].addcmul_(key, alpha[:, k].to(u.dtype))
        elif alpha.shape[2] == 1:  # a matrix-vector product: a K=1 GEMM is slow on CPU
            d_u[i, 0] += torch.mv(key.t(), alpha[:, k, 0].to(u.dtype))
        else:
            d_u[i] += alpha[:, k].t().to(u.dtype) @ key
    return d_u


def flat(scale: Tensor | None) -> Tensor | None:
    """A (1, n, 1) scale tensor as the kernels read it, (n,)."""
    return None if scale is None else scale.reshape(-1)


def save(ctx: Any, u: Tensor, rs: Tensor, w: Tensor, dots: Tensor, keys: Sequence[Tensor],
          values: Sequence[Tensor], outs: list[Tensor], lse: Tensor) -> tuple[Tensor, ...]:
    """Save what either backward reads (the same tensors on both paths); return the outputs."""
    ctx.save_for_backward(u, rs, w, dots, *keys, *(values if ctx.has_values else ()), *(outs if ctx.off else ()))
    ctx.mark_non_differentiable(w)
    return (*outs, lse, w)


def saved(ctx: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Sequence[Tensor], Sequence[Tensor], Sequence[Tensor]]:
    """What :func:`_save` saved: (u, rs, w, dots, keys, values, outs of a merge)."""
    u, rs, w, dots, *rest = ctx.saved_tensors
    n, m = ctx.n, 2 * ctx.n if ctx.has_values else ctx.n
    keys = rest[:n]
    return u, rs, w, dots, keys, (rest[n:m] if ctx.has_values else keys), rest[m:]


def as_c(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """``t`` as a contiguous tensor of ``dtype``, for the C kernel (scales (1, n, 1) are read as (n,))."""
    return None if t is None else t.to(dtype).contiguous()
