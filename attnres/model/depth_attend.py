"""The depth-attention kernel: softmax over a few source tensors per token, with a hand-written backward.

Written with plain autograd ops, one AttnRes site stacks its sources, normalises them, scales them
by a gain, dots them with a query and mixes them. Autograd then keeps every intermediate alive for
backward. (The results document measured its block variants at +83 % GPU memory and -46 % tokens/s
against the baseline.) This kernel computes the same function but saves only what backward cannot
recompute cheaply:

* the source tensors themselves (each one saved once however many sites read it);
* per source and site: the softmax weight, the raw dot ``K.u`` and the RMS statistic, which are
  scalars per token;
* for a merge with a *prior*, the output, which the next layer's norm saves anyway.

Everything else (normalised keys, gains and products) is folded away. The key norm's gain is folded
into the query, ``RMSNorm(K) * g . q = r(K) * (K . (g*q))``, so keys are never normalised in memory.
The RMS statistic ``r`` of a source is computed once, when the source is created, and passed in.
Gradients through ``r`` are part of the hand-written backward.

One call attends ``S`` sites that share their sources (the sites of one block against the completed
blocks), so the statistics and logits of the shared sources are computed once. A site's own sources
(partial block, window) are merged afterwards with an online-softmax update: its earlier result
enters as a *prior* with log-sum-exp ``lse``.

Three implementations compute the forward and backward: PyTorch ops (any device; logits, softmax and
the mix in float32 or wider whatever the sources' dtype, though under autocast the residual module
hands it float32 sources anyway); on CPU, for float32 and float64, a fused C kernel
(``depth_attend.c``, built by :mod:`attnres.model.cpu_kernel`); and on CUDA a Triton kernel
(``triton_kernel.py``, called by :mod:`attnres.model.gpu_kernel` through custom ops, so that
``torch.compile`` keeps the model one graph), which the tests run on CPU in Triton's interpreter.
Eager PyTorch makes about ten passes over a (tokens x d_model) tensor per (site, source) pair; the
kernels read each source a tile of tokens at a time. All save the same tensors and are checked
against the same reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnres.logline import say
from attnres.model import cpu_kernel, depth_kernels, gpu_kernel


def rms_rsqrt(x: Tensor, eps: float, scale: float = 1.0) -> Tensor:
    """``1 / sqrt(mean((scale * x)^2) + eps)`` over the last dim, in float32 or wider, without autograd."""
    with torch.no_grad():
        dt = torch.promote_types(x.dtype, torch.float32)
        ms = torch.linalg.vector_norm(x, dim=-1, dtype=dt).pow_(2).mul_(scale * scale / x.shape[-1])
        return ms.add_(eps).rsqrt_()


class _Attend(torch.autograd.Function):
    """See :func:`attend`. Tensor arguments are passed flat: keys, then values if they differ."""

    @staticmethod
    def forward(ctx: Any, n: int, per_token: bool, has_values: bool, scales: tuple[tuple[float, ...], ...] | None,
                index: tuple[int, ...], u: Tensor, rs: Tensor, bias: Tensor | None, prior: Tensor | None,
                prior_lse: Tensor | None, *distinct: Tensor) -> tuple[Tensor, ...]:
        flat = [distinct[i] for i in index]  # (each tensor is passed once: torch.compile traces no duplicates)
        ctx.index, ctx.n_distinct = index, len(distinct)
        keys = flat[:n]
        values = flat[n:] if has_values else keys
        cdt = rs.dtype
        n_sites = 1 if per_token else u.shape[1]
        iu = [k if u.shape[0] > 1 else 0 for k in range(n)]
        ctx.n, ctx.per_token, ctx.has_values, ctx.off, ctx.iu = n, per_token, has_values, int(prior is not None), iu
        ctx.scales = scales
        ctx.has_bias = bias is not None
        given = [u, rs, *flat, *(t for t in (bias, prior, prior_lse) if t is not None)]
        ctx.triton = gpu_kernel.applies(given) and (gpu_kernel.is_forced() or _triton_trusted(str(u.device)))
        if not ctx.triton and cpu_kernel.widens(given, cdt):  # exact float32 copies of bf16 sources for C
            flat = [t.to(cdt) for t in flat]
            keys = flat[:n]
            values = flat[n:] if has_values else keys
            prior = prior.to(cdt) if prior is not None else None
            given = [u, rs, *flat, *(t for t in (bias, prior, prior_lse) if t is not None)]
        ctx.fused = None if ctx.triton else cpu_kernel.kernel(given)
        if ctx.triton:
            return depth_kernels.forward_triton(ctx, u, rs, bias, prior, prior_lse, keys, values, n_sites)
        if ctx.fused is not None:
            return depth_kernels.forward_c(ctx, u, rs, bias, prior, prior_lse, keys, values, n_sites)
        # logits in the statistics' dtype (float32 or wider) even for bf16 sources: a logit rounded to
        # bf16 is off by up to 0.4 % of its size, an error in the softmax's exponent that grows with it
        dot = torch.linalg.vecdot if per_token else F.linear  # a key's cdt copy lives for one dot only
        dots = torch.stack([dot(key.to(cdt), u[i].to(cdt)) for key, i in zip(keys, iu, strict=True)], 1)
        dots = dots[:, :, None] if per_token else dots
        ks, vs = depth_kernels.scale_tensors(scales, rs)
        dots = dots if ks is None else dots * ks  # (N, n, S): K . u, before the norm
        logits = dots * rs[:, :, None]
        if bias is not None:
            logits = logits + bias.to(cdt)
        if prior is not None:
            logits = torch.cat([prior_lse.to(cdt)[:, None, None], logits], 1)
        lse = torch.logsumexp(logits, 1)  # (N, S)
        w = torch.exp(logits - lse[:, None])  # (N, m, S), m = n (+1 with a prior, first)
        off = ctx.off
        # the weights stay in cdt, so the mix accumulates in float32 (or wider) whatever the sources' dtype
        wv = w if vs is None else torch.cat([w[:, :off], w[:, off:] * vs], 1)
        outs = [prior * wv[:, 0, s, None] if prior is not None else values[0] * wv[:, 0, s, None]
                for s in range(n_sites)]
        for k in range(1 - off, n):  # each source read once for all sites
            for s, o in enumerate(outs):
                o.addcmul_(values[k], wv[:, off + k, s, None])
        return depth_kernels.save(ctx, u, rs, w, dots, keys, values, outs, lse)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        head, flat = (got := _Attend.gradients(ctx, grads))[:9], got[9:]
        merged: list[Tensor | None] = [None] * ctx.n_distinct  # a tensor given as several sources: their sum
        for i, g in zip(ctx.index, flat, strict=True):
            if g is not None:
                merged[i] = g if merged[i] is None else merged[i] + g
        return (*head[:4], None, *head[4:], *merged)

    @staticmethod
    def gradients(ctx: Any, grads: Sequence[Tensor | None]) -> tuple[Tensor | None, ...]:
        """The gradients of forward's arguments as if every source had been passed as its own tensor."""
        if ctx.triton:
            return depth_kernels.backward_triton(ctx, grads)
        if ctx.fused is not None:
            return depth_kernels.backward_c(ctx, grads)
        n, off, iu = ctx.n, ctx.off, ctx.iu
        u, rs, w, dots, keys, values, outs = depth_kernels.saved(ctx)
        n_sites = w.shape[2]
        g_out = [g if g is not None else torch.zeros_like(values[0]) for g in grads[:n_sites]]
        g_lse = grads[n_sites]
        cdt = w.dtype
        scratch = torch.empty_like(g_out[0])

        def rowdot(a: Tensor, b: Tensor) -> Tensor:  # per-row dot through one reused buffer
            return torch.mul(a, b, out=scratch).sum(-1, dtype=cdt)

        # softmax backward: d logit_k = w_k (V_k . G - out . G) (+ w_k d lse)
        ks, vs = depth_kernels.scale_tensors(ctx.scales, rs)
        g = torch.stack([torch.stack([rowdot(v, gs) for gs in g_out], 1) for v in values], 1)  # (N, n, S)
        g = g if vs is None else g * vs
        wk = w[:, off:]
        if off:
            total = torch.stack([rowdot(o, gs) for o, gs in zip(outs, g_out, strict=True)], 1)
            part = (wk * g).sum(1)  # the sources' share of out . G; the prior has the rest
        else:
            total = part = (wk * g).sum(1)
        d_logit = wk * (g - total[:, None])
        d_prior = d_prior_lse = None
        if off:
            w0 = w[:, 0]
            d_prior_lse = (total - part - w0 * total)[:, 0]
            d_prior = g_out[0] * w0.to(g_out[0].dtype)
        if g_lse is not None:
            d_logit = d_logit + wk * g_lse[:, None]
            if off:
                d_prior_lse = d_prior_lse + (w0 * g_lse)[:, 0]
        d_bias = d_logit.sum(0) if ctx.has_bias else None
        # d loss / d (K . u), then through the norm (d r / d K = -r^3 K / D); both onto the
        # unscaled key tensor (times its scale once, and twice for the term in K itself)
        alpha = d_logit * rs[:, :, None]
        coef = -(d_logit * dots).sum(2) * rs.pow(3) / keys[0].shape[-1]  # (N, n)
        if ks is not None:
            alpha, coef = alpha * ks, coef * ks[:, :, 0].pow(2)
        wv = wk if vs is None else wk * vs
        d_keys, d_values = [], []
        for k in range(n):
            i = iu[k]
            dv = torch.mul(g_out[0], wv[:, k, 0, None])  # value gradient sum_s w_ks G_s ...
            for s in range(1, n_sites):
                dv.addcmul_(g_out[s], wv[:, k, s, None])
            # ... into which the key terms go too, unless keys and values are different tensors
            dk = torch.mul(keys[k], coef[:, k, None]) if ctx.has_values else dv.addcmul_(keys[k], coef[:, k, None])
            ddt = dk.dtype  # may be wider than the keys (bf16 sources, float32 embedding)
            if ctx.per_token:
                dk.addcmul_(u[i].to(ddt), alpha[:, k].to(ddt))
            elif n_sites == 1:  # outer product: a K=1 GEMM is slow on CPU
                dk.addr_(alpha[:, k, 0].to(ddt), u[i, 0].to(ddt))
            else:
                dk.addmm_(alpha[:, k].to(ddt), u[i].to(ddt))
            d_keys.append(dk)
            if ctx.has_values:
                d_values.append(dv)
        d_u = depth_kernels.query_grad(u, keys, alpha, iu, ctx.per_token)
        return (None, None, None, None, d_u, None, d_bias, d_prior, d_prior_lse, *d_keys, *d_values)


def attend(keys: Sequence[Tensor], u: Tensor, rs: Sequence[Tensor], *, values: Sequence[Tensor] | None = None,
           bias: Tensor | None = None, per_token: bool = False, prior: tuple[Tensor, Tensor] | None = None,
           scales: Sequence[float] | None = None,
           value_scales: Sequence[float] | None = None) -> tuple[list[Tensor], Tensor, Tensor]:
    """Attend ``S`` sites over ``n`` sources: ``out_s = sum_k softmax_k(r_k * K_k . u_ks + bias_ks) V_k``.

    Args:
        keys: ``n`` tensors (N, D): the sources, token-major.
        u: effective queries (gain folded in): (1 or n, S, D), or with ``per_token`` (1 or n, N, D) and S = 1.
        rs: ``n`` tensors (N,): ``rms_rsqrt`` of each (scaled) key, computed once per source.
        values: what is mixed, if not the keys themselves (a value projection).
        bias: (n, S) additive logit bias (ALiBi).
        prior: ``(out, lse)`` of an earlier attend over other sources of the same site (S = 1);
            the result is the softmax over both source sets together (online-softmax merge).
        scales, value_scales: each key (value) is ``scale * tensor``: a mean of outputs is passed as
            their sum and ``1 / count``, which saves a division and its backward.

    Returns:
        (outputs: S tensors (N, D), lse (N, S), weights (N, [1 +] n, S) detached, prior first).
    """
    p, p_lse = prior if prior is not None else (None, None)
    both = None
    if scales is not None:
        both = (tuple(scales), tuple(value_scales or scales) if values is not None else tuple(scales))
    distinct: list[Tensor] = []
    index = []
    for t in (*keys, *(values or ())):
        at = next((i for i, seen in enumerate(distinct) if seen is t), None)
        if at is None:
            at = len(distinct)
            distinct.append(t)
        index.append(at)
    *outs, lse, w = _Attend.apply(len(keys), per_token, values is not None, both, tuple(index), u,
                                  torch.stack(list(rs), 1), bias, p, p_lse, *distinct)
    return outs, lse, w


# -- the Triton kernel's self-check ------------------------------------------------------------------
@gpu_kernel.constant_to_compile
def _triton_trusted(device: str) -> bool:
    """Whether the Triton kernel passed its self-check on ``device`` (a constant to ``torch.compile``,
    computed eagerly, not traced)."""
    return _triton_checked(device)


@cache
def _triton_checked(device: str) -> bool:
    """Check the Triton kernel once per device and process, before its first real call there. One that
    does not build on this GPU, or disagrees with the PyTorch path, is not used: one line says so, and
    depth attention takes the PyTorch path."""
    try:
        err = triton_self_check(torch.device(device))
    except Exception as exc:  # noqa: BLE001 - a compiler or driver failure: the PyTorch path instead
        say(f"attnres: the Triton depth-attention kernel failed on {device} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); using the PyTorch path", err=True)
        return False
    if not err < 1e-4:
        say(f"attnres: the Triton depth-attention kernel disagrees with the PyTorch path on {device} "
            f"(relative error {err:.1e}); using the PyTorch path", err=True)
        return False
    return True


def triton_self_check(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """The largest relative difference between the Triton and the other path over outputs, log-sum-exps
    and every gradient, for calls (float32 by default) with shared and per-source queries, ALiBi bias, scales,
    per-token queries and a prior merged with projected values (37 tokens, 80 channels: several token
    tiles and channel chunks, both ends masked)."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype).to(device)

    n_tok, d, n = 37, 80, 3
    calls = [{"u": rand(1, 2, d)}, {"u": rand(n, 2, d), "bias": rand(n, 2), "scales": [0.5, 1.0, 1 / 3]},
             {"u": rand(1, n_tok, d), "per_token": True},
             {"u": rand(1, 1, d), "values": [rand(n_tok, d) for _ in range(n)], "prior": (rand(n_tok, d), rand(n_tok))}]
    keys, worst = [rand(n_tok, d) for _ in range(n)], 0.0
    for call in calls:
        leaves = [t for t in (*keys, call["u"], *call.get("values", ()), call.get("bias"), *call.get("prior", ()))
                  if t is not None]
        results = []
        for triton in (False, True):
            xs = [t.detach().clone().requires_grad_() for t in leaves]
            it = iter(xs)
            ks, args = [next(it) for _ in keys], dict(call)
            args["u"] = next(it)
            if "values" in call:
                args["values"] = [next(it) for _ in call["values"]]
            if "bias" in call:
                args["bias"] = next(it)
            if "prior" in call:
                args["prior"] = (next(it), next(it))
            # (the first real call may come from inside an autograd forward, where grad mode is off)
            with gpu_kernel.forced(triton), torch.enable_grad():
                outs, lse, _ = attend(ks, rs=[rms_rsqrt(k, 1e-6) for k in ks], **args)
                probe = torch.Generator().manual_seed(1)
                loss = sum((o * torch.randn(o.shape, generator=probe, dtype=dtype).to(device)).sum() for o in outs)
                loss = loss + lse.sum()
                results.append([t.detach() for t in (*outs, lse, *torch.autograd.grad(loss, xs))])
        for want, got in zip(*results, strict=True):
            worst = max(worst, float((got - want).norm() / want.norm().clamp_min(1e-30)))
    return worst


def kernel_path(device: str) -> str:
    """The path depth attention takes on ``device`` here, in words (for ``attnres bench``)."""
    probe = torch.zeros(1, device=device)
    if gpu_kernel.applies([probe]):
        if not _triton_trusted(str(probe.device)):
            return "pytorch (the Triton kernel failed its self-check: see above)"
        return "triton (interpreter)" if device == "cpu" else "triton"
    if device == "cpu":
        return cpu_kernel.status()
    return "pytorch" if gpu_kernel.installed() else "pytorch (triton not installed)"
