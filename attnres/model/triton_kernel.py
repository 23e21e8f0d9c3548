"""The Triton kernels of depth attention (called through :mod:`attnres.model.gpu_kernel`, which says what they do).

Layouts (all contiguous): sources (N, D), read through tables of their addresses; queries ``u``
(n_u, S, D), or (n_u, N, D) per token; ``rs`` (N, n); ``bias`` (n, S); scales (n,); ``lse`` (N, S);
weights ``w`` (N, off + n, S) with the prior first; ``dots`` and logits' gradients (N, n, S).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _source(table, k, like):
    """The k-th source's address, typed as ``like``'s."""
    return tl.load(table + k).to(like.dtype)


@triton.jit
def forward_kernel(k_tab, v_tab, k_like, v_like, u_ptr, rs_ptr, bias_ptr, ks_ptr, vs_ptr, prior_ptr, prior_lse_ptr,
                   o_tab, lse_ptr, w_ptr, dots_ptr, N, D, n, S,
                   PER_TOKEN: tl.constexpr, SHARED_U: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HAS_SCALES: tl.constexpr, HAS_PRIOR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    tile, s = tl.program_id(0), tl.program_id(1)
    rows = (tile * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # offsets past 2^31 elements
    rmask = rows < N
    cdt = rs_ptr.dtype.element_ty
    off = 1 if HAS_PRIOR else 0
    m_run = tl.full((BLOCK_N,), float("-inf"), cdt)
    l_run = tl.zeros((BLOCK_N,), cdt)
    if HAS_PRIOR:  # the prior enters the softmax as one more logit, its log-sum-exp
        lp = tl.load(prior_lse_ptr + rows, mask=rmask, other=0.0).to(cdt)
        tl.store(w_ptr + (rows * (n + 1)) * S + s, lp, mask=rmask)
        m_run = lp
        l_run = tl.full((BLOCK_N,), 1.0, cdt)
    for k in range(n):  # logits, each source read once, and an online softmax over them
        kp = _source(k_tab, k, k_like)
        ui = 0 if SHARED_U else k
        acc = tl.zeros((BLOCK_N,), cdt)
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            mask = rmask[:, None] & (cols[None, :] < D)
            x = tl.load(kp + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(cdt)
            if PER_TOKEN:
                q = tl.load(u_ptr + (ui * N + rows[:, None]) * D + cols[None, :], mask=mask, other=0.0).to(cdt)
            else:
                q = tl.load(u_ptr + (ui * S + s) * D + cols, mask=cols < D, other=0.0).to(cdt)[None, :]
            acc += tl.sum(x * q, 1)
        if HAS_SCALES:
            acc = acc * tl.load(ks_ptr + k).to(cdt)
        tl.store(dots_ptr + (rows * n + k) * S + s, acc, mask=rmask)
        logit = acc * tl.load(rs_ptr + rows * n + k, mask=rmask, other=0.0).to(cdt)
        if HAS_BIAS:
            logit = logit + tl.load(bias_ptr + k * S + s).to(cdt)
        tl.store(w_ptr + (rows * (n + off) + off + k) * S + s, logit, mask=rmask)
        m_new = tl.maximum(m_run, logit)
        l_run = l_run * tl.exp(m_run - m_new) + tl.exp(logit - m_new)
        m_run = m_new
    lse = m_run + tl.log(l_run)
    tl.store(lse_ptr + rows * S + s, lse, mask=rmask)
    tl.debug_barrier()  # what one thread stored, another may read: the logits are in memory for all
    for k in range(n + off):  # the weights, from the logits kept in their place
        at = w_ptr + (rows * (n + off) + k) * S + s
        tl.store(at, tl.exp(tl.load(at, mask=rmask, other=0.0) - lse), mask=rmask)
    tl.debug_barrier()
    op = _source(o_tab, s, k_like)
    for d0 in range(0, D, BLOCK_D):  # the mix, a chunk of d_model at a time
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = rmask[:, None] & (cols[None, :] < D)
        out = tl.zeros((BLOCK_N, BLOCK_D), cdt)
        if HAS_PRIOR:
            w0 = tl.load(w_ptr + (rows * (n + 1)) * S + s, mask=rmask, other=0.0)
            out += tl.load(prior_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(cdt) * w0[:, None]
        for k in range(n):
            wk = tl.load(w_ptr + (rows * (n + off) + off + k) * S + s, mask=rmask, other=0.0)
            if HAS_SCALES:
                wk = wk * tl.load(vs_ptr + k).to(cdt)
            vp = _source(v_tab, k, v_like)
            out += tl.load(vp + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(cdt) * wk[:, None]
        tl.store(op + rows[:, None] * D + cols[None, :], out.to(k_like.dtype.element_ty), mask=mask)


@triton.jit
def _rowdot(a_tab, a_i, a_like, b_tab, b_i, rows, rmask, D, cdt, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per token, the dot of row ``rows`` of tensor ``a_i`` of one table with that of ``b_i`` of another."""
    ap = _source(a_tab, a_i, a_like)
    bp = _source(b_tab, b_i, a_like)
    acc = tl.zeros((BLOCK_N,), cdt)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        mask = rmask[:, None] & (cols[None, :] < D)
        a = tl.load(ap + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(cdt)
        b = tl.load(bp + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(cdt)
        acc += tl.sum(a * b, 1)
    return acc


@triton.jit
def backward_kernel(k_tab, v_tab, g_tab, dk_tab, dv_tab, o_tab, k_like, v_like, u_ptr, rs_ptr, w_ptr, dots_ptr,
                    ks_ptr, vs_ptr, g_lse_ptr, dl_ptr, d_prior_ptr, d_prior_lse_ptr, N, D, n, S,
                    PER_TOKEN: tl.constexpr, SHARED_U: tl.constexpr, HAS_SCALES: tl.constexpr,
                    HAS_VALUES: tl.constexpr, HAS_PRIOR: tl.constexpr, HAS_GLSE: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    tile = tl.program_id(0)
    rows = (tile * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # offsets past 2^31 elements
    rmask = rows < N
    cdt = rs_ptr.dtype.element_ty
    off = 1 if HAS_PRIOR else 0
    # softmax backward, per site: d logit_k = w_k (V_k . G - out . G) (+ w_k d lse); kept in dl_ptr
    for s in range(S):
        part = tl.zeros((BLOCK_N,), cdt)
        for k in range(n):
            g = _rowdot(v_tab, k, v_like, g_tab, s, rows, rmask, D, cdt, BLOCK_N, BLOCK_D)
            if HAS_SCALES:
                g = g * tl.load(vs_ptr + k).to(cdt)
            wk = tl.load(w_ptr + (rows * (n + off) + off + k) * S + s, mask=rmask, other=0.0)
            part += wk * g
            tl.store(dl_ptr + (rows * n + k) * S + s, g, mask=rmask)
        tl.debug_barrier()  # the dots V_k . G stored above are read back below, maybe by other threads
        if HAS_PRIOR:  # out . G, the prior's share included
            total = _rowdot(o_tab, s, k_like, g_tab, s, rows, rmask, D, cdt, BLOCK_N, BLOCK_D)
        else:
            total = part
        g_lse = tl.zeros((BLOCK_N,), cdt)
        if HAS_GLSE:
            g_lse = tl.load(g_lse_ptr + rows * S + s, mask=rmask, other=0.0).to(cdt)
        for k in range(n):
            at = dl_ptr + (rows * n + k) * S + s
            wk = tl.load(w_ptr + (rows * (n + off) + off + k) * S + s, mask=rmask, other=0.0)
            tl.store(at, wk * (tl.load(at, mask=rmask, other=0.0) - total + g_lse), mask=rmask)
        if HAS_PRIOR:  # one site: the prior's weight times G, and the gradient of its log-sum-exp
            w0 = tl.load(w_ptr + (rows * (n + 1)) * S + s, mask=rmask, other=0.0)
            tl.store(d_prior_lse_ptr + rows, total - part - w0 * total + w0 * g_lse, mask=rmask)
            gp = _source(g_tab, s, k_like)
            for d0 in range(0, D, BLOCK_D):
                cols = d0 + tl.arange(0, BLOCK_D)
                mask = rmask[:, None] & (cols[None, :] < D)
                gg = tl.load(gp + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(cdt)
                tl.store(d_prior_ptr + rows[:, None] * D + cols[None, :],
                         (gg * w0[:, None]).to(d_prior_ptr.dtype.element_ty), mask=mask)
    tl.debug_barrier()  # every logit gradient is in memory before the sources' pass reads them
    # each source: its value gradient sum_s w_ks G_s and its key gradient through the norm and the query
    for k in range(n):
        ks = 1.0
        vs = 1.0
        if HAS_SCALES:
            ks = tl.load(ks_ptr + k).to(cdt)
            vs = tl.load(vs_ptr + k).to(cdt)
        rs = tl.load(rs_ptr + rows * n + k, mask=rmask, other=0.0).to(cdt)
        coef = tl.zeros((BLOCK_N,), cdt)
        for s in range(S):
            dl = tl.load(dl_ptr + (rows * n + k) * S + s, mask=rmask, other=0.0)
            coef += dl * tl.load(dots_ptr + (rows * n + k) * S + s, mask=rmask, other=0.0)
        coef = -coef * rs * rs * rs / D * ks * ks
        kp = _source(k_tab, k, k_like)
        dkp = _source(dk_tab, k, k_like)
        dvp = _source(dv_tab, k, v_like)
        ui = 0 if SHARED_U else k
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            mask = rmask[:, None] & (cols[None, :] < D)
            at = rows[:, None] * D + cols[None, :]
            dv = tl.zeros((BLOCK_N, BLOCK_D), cdt)
            dk = tl.load(kp + at, mask=mask, other=0.0).to(cdt) * coef[:, None]
            for s in range(S):
                wk = tl.load(w_ptr + (rows * (n + off) + off + k) * S + s, mask=rmask, other=0.0) * vs
                gp = _source(g_tab, s, k_like)
                dv += tl.load(gp + at, mask=mask, other=0.0).to(cdt) * wk[:, None]
                alpha = tl.load(dl_ptr + (rows * n + k) * S + s, mask=rmask, other=0.0) * rs * ks
                if PER_TOKEN:
                    q = tl.load(u_ptr + (ui * N + rows[:, None]) * D + cols[None, :], mask=mask, other=0.0).to(cdt)
                else:
                    q = tl.load(u_ptr + (ui * S + s) * D + cols, mask=cols < D, other=0.0).to(cdt)[None, :]
                dk += alpha[:, None] * q
            if HAS_VALUES:
                tl.store(dvp + at, dv.to(v_like.dtype.element_ty), mask=mask)
            else:  # keys and values are one tensor: both terms in one gradient
                dk += dv
            tl.store(dkp + at, dk.to(k_like.dtype.element_ty), mask=mask)
