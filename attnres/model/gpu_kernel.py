"""Depth attention in Triton: the forward and backward of :class:`attnres.model.depth_attend._Attend` for GPUs.

The same contract as the PyTorch and C paths (per-site and shared queries, the key norm's gain folded
into the query, per-token queries, ALiBi bias, key and value scales of scaled means, a value
projection, the online-softmax merge of a prior) and the same saved tensors, so any path's backward
can follow any path's forward. Logits, softmax and every accumulation are in the statistics' dtype
(float32, or float64), whatever the sources' dtype; outputs and gradients of sources are in the
sources' dtype.

One program takes a tile of tokens. The forward runs one program per (tile, site): the logits of the
tile against each source, an online softmax over them, then the mix, one chunk of ``d_model`` at a
time; only scalars per token are written besides the outputs (the logits' ``K . u``, the weights and
the log-sum-exp, which backward needs). The backward runs one program per tile for all sites, since a
source's gradient sums over them; the query's gradient (a sum over tokens) and the bias's are left to
one matrix product and one sum in PyTorch, from the logits' gradients that the kernel writes.

Sources are passed as a table of addresses, so no stacked copy of them is ever made.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton is
imported), on CPU tensors in float32, float64 and bfloat16: that is how the test suite checks them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache

import torch
from torch import Tensor

BLOCK_N, BLOCK_D = 16, 64
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def requested() -> str:
    """``ATTNRES_TRITON_KERNEL``: ``auto`` (default: on CUDA tensors), ``1`` (also CPU tensors, through
    Triton's interpreter) or ``0`` (never)."""
    value = os.environ.get("ATTNRES_TRITON_KERNEL", "auto").strip().lower()
    return {"1": "1", "true": "1", "yes": "1", "on": "1", "0": "0", "false": "0", "no": "0", "off": "0"}.get(value,
                                                                                                          "auto")


@cache
def _kernels() -> tuple[object, object] | None:
    """The compiled (forward, backward) kernels, or None where Triton is not installed."""
    try:
        from attnres.model import triton_kernel as jit
    except ImportError:
        return None
    return jit.forward_kernel, jit.backward_kernel


def constant_to_compile(fn: Callable[..., bool]) -> Callable[..., bool]:
    """``torch.compiler.assume_constant_result``: ``torch.compile`` takes ``fn``'s result as a constant. The same
    marker set without importing ``torch._dynamo`` (which that function does first: over a second of every
    trainer's start, for a model that is not compiled)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]  # (torch._dynamo.decorators sets exactly this)
    return fn


_force: bool | None = None  # set while a self-check runs both paths (attnres.model.depth_attend.triton_self_check)


@constant_to_compile
def installed() -> bool:
    """Whether the kernels can be had (Triton imports); a constant to ``torch.compile``, not traced."""
    return _kernels() is not None


def is_forced() -> bool:
    """Whether a self-check is choosing the path for every call now (see :func:`forced`)."""
    return _force is not None


@contextmanager
def forced(on: bool) -> Iterator[None]:
    """Every call takes (``on``) or avoids the Triton path meanwhile: the self-check runs both."""
    global _force
    _force = on
    try:
        yield
    finally:
        _force = None


def applies(tensors: Sequence[Tensor]) -> bool:
    """Whether this call may take the Triton path: asked for (or ``auto`` on CUDA), Triton importable,
    every tensor on one device and of a dtype the kernels take; CPU tensors only in the interpreter.
    (:mod:`attnres.model.depth_attend` also has the kernel pass its self-check on the device first.)"""
    if _force is not None:
        return _force
    want = requested()
    if want == "0":
        return False
    device = tensors[0].device
    if any(t.device != device or t.dtype not in DTYPES for t in tensors):
        return False
    if device.type == "cpu":
        if want != "1" or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            return False
    elif device.type != "cuda":
        return False
    return installed()


def _table(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    """The tensors' data addresses as an int64 tensor, where the kernels read them."""
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)


def forward(u: Tensor, rs: Tensor, bias: Tensor | None, ks: Tensor | None, vs: Tensor | None, prior: Tensor | None,
            prior_lse: Tensor | None, keys: Sequence[Tensor], values: Sequence[Tensor], n_sites: int,
            per_token: bool) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
    """(outs: S tensors (N, D), lse (N, S), w (N, off + n, S), dots (N, n, S)), as the PyTorch path's.

    Through a custom op (``attnres::depth_attend_forward``), which ``torch.compile`` keeps whole in its
    graph: the kernel's address tables are made inside it, where tracing does not look.
    """
    return _forward_op(list(keys), list(values), u, rs, bias, ks, vs, prior, prior_lse, n_sites, per_token)


@torch.library.custom_op("attnres::depth_attend_forward", mutates_args=())
def _forward_op(keys: list[Tensor], values: list[Tensor], u: Tensor, rs: Tensor, bias: Tensor | None,
                ks: Tensor | None, vs: Tensor | None, prior: Tensor | None, prior_lse: Tensor | None, n_sites: int,
                per_token: bool) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
    import triton  # (importable: _kernels() found it)

    fwd, _ = _kernels()
    has_prior = prior is not None
    n, (big_n, d), off = len(keys), keys[0].shape, int(has_prior)
    keys, values = _alike(keys, values)
    u, rs = u.contiguous(), rs.contiguous()
    outs = [torch.empty_like(keys[0]) for _ in range(n_sites)]
    lse = rs.new_empty(big_n, n_sites)
    w = rs.new_empty(big_n, n + off, n_sites)
    dots = rs.new_empty(big_n, n, n_sites)
    dummy = rs.new_empty(1)
    device = keys[0].device
    k_tab, v_tab, o_tab = _table(keys, device), _table(values, device), _table(outs, device)
    grid = (triton.cdiv(big_n, BLOCK_N), n_sites)
    fwd[grid](k_tab, v_tab, keys[0], values[0], u, rs, _or(bias, dummy), _or(ks, dummy), _or(vs, dummy),
              _or(prior, keys[0]), _or(prior_lse, dummy), o_tab, lse, w, dots, big_n, d, n, n_sites,
              PER_TOKEN=per_token, SHARED_U=u.shape[0] == 1, HAS_BIAS=bias is not None, HAS_SCALES=ks is not None,
              HAS_PRIOR=has_prior, BLOCK_N=BLOCK_N, BLOCK_D=min(BLOCK_D, triton.next_power_of_2(d)))
    return outs, lse, w, dots


@_forward_op.register_fake
def _(keys: list[Tensor], values: list[Tensor], u: Tensor, rs: Tensor, bias: Tensor | None, ks: Tensor | None,
      vs: Tensor | None, prior: Tensor | None, prior_lse: Tensor | None, n_sites: int,
      per_token: bool) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
    n, big_n, off = len(keys), keys[0].shape[0], int(prior is not None)
    dt = _common_dtype([*keys, *values])
    return ([keys[0].new_empty(keys[0].shape, dtype=dt) for _ in range(n_sites)], rs.new_empty(big_n, n_sites),
            rs.new_empty(big_n, n + off, n_sites), rs.new_empty(big_n, n, n_sites))


def backward(u: Tensor, rs: Tensor, w: Tensor, dots: Tensor, ks: Tensor | None, vs: Tensor | None,
             keys: Sequence[Tensor], values: Sequence[Tensor], outs: Sequence[Tensor], g_out: Sequence[Tensor],
             g_lse: Tensor | None, per_token: bool, has_values: bool, has_prior: bool,
             ) -> tuple[Tensor, Tensor | None, Tensor | None, list[Tensor], list[Tensor]]:
    """(d_logit (N, n, S), d_prior, d_prior_lse, d_keys, d_values) through the custom op
    ``attnres::depth_attend_backward``; the sums over tokens (the query's and the bias's gradients)
    are left to :mod:`attnres.model.depth_attend`, as on its other paths."""
    d_logit, d_prior, d_prior_lse, d_keys, d_values = _backward_op(
        u, rs, w, dots, ks, vs, list(keys), list(values) if has_values else [], list(outs) if has_prior else [],
        list(g_out), g_lse, per_token)
    return d_logit, (d_prior if has_prior else None), (d_prior_lse if has_prior else None), d_keys, d_values


@torch.library.custom_op("attnres::depth_attend_backward", mutates_args=())
def _backward_op(u: Tensor, rs: Tensor, w: Tensor, dots: Tensor, ks: Tensor | None, vs: Tensor | None,
                 keys: list[Tensor], values: list[Tensor], outs: list[Tensor], g_out: list[Tensor],
                 g_lse: Tensor | None, per_token: bool) -> tuple[Tensor, Tensor, Tensor, list[Tensor], list[Tensor]]:
    """(d_logit (N, n, S), d_prior, d_prior_lse, d_keys, d_values): empty ``values`` means keys are the values
    (and ``d_values`` is empty); empty ``outs`` means no prior (``d_prior``, ``d_prior_lse`` are then empty)."""
    import triton

    _, bwd = _kernels()
    has_values, has_prior = bool(values), bool(outs)
    n, (big_n, d), n_sites = len(keys), keys[0].shape, w.shape[2]
    device = keys[0].device
    keys, values = _alike(keys, values or keys)
    g_out = [g.to(keys[0].dtype).contiguous() for g in g_out]
    d_keys = [torch.empty_like(k) for k in keys]
    d_values = [torch.empty_like(v) for v in values] if has_values else []
    d_logit = rs.new_empty(big_n, n, n_sites)
    d_prior = torch.empty_like(keys[0]) if has_prior else keys[0].new_empty(0)
    d_prior_lse = rs.new_empty(big_n if has_prior else 0)
    dummy = rs.new_empty(1)
    tables = [_table(ts, device) for ts in (keys, values, g_out, d_keys, d_values or d_keys)]
    bwd[(triton.cdiv(big_n, BLOCK_N),)](
        *tables, _table(outs if has_prior else g_out, device), keys[0], values[0], u.contiguous(), rs.contiguous(),
        w, dots, _or(ks, dummy), _or(vs, dummy), _or(g_lse, dummy), d_logit, d_prior, d_prior_lse,
        big_n, d, n, n_sites, PER_TOKEN=per_token, SHARED_U=u.shape[0] == 1, HAS_SCALES=ks is not None,
        HAS_VALUES=has_values, HAS_PRIOR=has_prior, HAS_GLSE=g_lse is not None, BLOCK_N=BLOCK_N,
        BLOCK_D=min(BLOCK_D, triton.next_power_of_2(d)))
    return d_logit, d_prior, d_prior_lse, d_keys, d_values


@_backward_op.register_fake
def _(u: Tensor, rs: Tensor, w: Tensor, dots: Tensor, ks: Tensor | None, vs: Tensor | None, keys: list[Tensor],
      values: list[Tensor], outs: list[Tensor], g_out: list[Tensor], g_lse: Tensor | None,
      per_token: bool) -> tuple[Tensor, Tensor, Tensor, list[Tensor], list[Tensor]]:
    big_n, n_sites, dt = keys[0].shape[0], w.shape[2], _common_dtype([*keys, *values])
    like = keys[0].new_empty(keys[0].shape, dtype=dt)
    return (rs.new_empty(big_n, len(keys), n_sites), torch.empty_like(like) if outs else like.new_empty(0),
            rs.new_empty(big_n if outs else 0), [torch.empty_like(like) for _ in keys],
            [torch.empty_like(like) for _ in values])


def _common_dtype(tensors: Sequence[Tensor]) -> torch.dtype:
    dt = tensors[0].dtype
    for t in tensors:
        dt = torch.promote_types(dt, t.dtype)
    return dt


def _alike(keys: Sequence[Tensor], values: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """Keys and values contiguous, in one dtype (the widest of theirs): the kernels type a table's
    addresses as its first tensor's (a float32 embedding beside bf16 layer outputs takes copies)."""
    dt = _common_dtype([*keys, *values])
    return [k.to(dt).contiguous() for k in keys], [v.to(dt).contiguous() for v in values]


def _or(t: Tensor | None, fallback: Tensor) -> Tensor:
    """A tensor argument the kernel does not read (its flag is off) still needs a pointer."""
    return fallback if t is None else t.contiguous()
