"""The optimised depth-attention kernel computes exactly what the plain reference computes.

Float64 on CPU, random inputs and random (non-zero) parameters so that the softmax is far from
uniform; forward output and the gradients of the embedding, of the steps' weights and of every
depth-attention parameter agree to a relative error below 1e-6.
"""

from __future__ import annotations

import os

import pytest
import torch
from reference_depth import reference_forward

from attnres.model import cpu_kernel, depth_attend, depth_kernels
from attnres.model.residual import DepthAttention
from attnres.variants.registry import VARIANTS

DEPTH = sorted(n for n, v in VARIANTS.items() if v.residual.kind == "depth")
DEVICE = os.environ.get("ATTNRES_TEST_DEVICE", "cpu")  # cuda: the GPU check (`make gpu-check`)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def build(name: str, n_steps: int, d: int, seed: int) -> tuple[DepthAttention, torch.Tensor, list, list]:
    torch.manual_seed(seed)
    res = DepthAttention(VARIANTS[name].residual, d_model=d, n_steps=n_steps, eps=1e-6).double()
    with torch.no_grad():
        for p in res.parameters():
            p.add_(torch.randn_like(p) * 0.7)
    res = res.to(DEVICE)
    emb = torch.randn(2, 5, d, dtype=torch.float64).to(DEVICE).requires_grad_()
    weights = [torch.nn.Parameter((torch.randn(d, d, dtype=torch.float64) / d ** 0.5).to(DEVICE))
               for _ in range(n_steps)]
    steps = [lambda x, w=w: torch.tanh(x @ w) * 2.0 for w in weights]
    return res, emb, weights, steps


def grads_of(out: torch.Tensor, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    torch.manual_seed(123)
    probe = torch.randn_like(out)
    return list(torch.autograd.grad((out * probe).sum(), leaves, allow_unused=True))


@pytest.mark.parametrize("name,n_steps", [*((n, s) for n in DEPTH for s in (7, 9)),
                                          ("full_attnres", 40), ("attnres_paper", 40)])  # many sources
def test_kernel_matches_the_plain_reference_forward_and_gradients(name, n_steps, kernel_path):
    if kernel_path == "triton" and (n_steps == 9 or (name == "full_attnres" and n_steps == 40)):
        pytest.skip("Triton's interpreter is slow: 7 steps of each variant and attnres_paper's 40 cover it")
    res, emb, weights, steps = build(name, n_steps, d=8, seed=n_steps)
    leaves = [emb, *weights, *res.parameters()]
    fast = res(emb, steps)
    ref = reference_forward(res, emb, steps)
    assert rel_err(fast, ref) < 1e-6
    names = ["emb", *[f"step{i}" for i in range(n_steps)], *[n for n, _ in res.named_parameters()]]
    for label, g_fast, g_ref in zip(names, grads_of(fast, leaves), grads_of(ref, leaves), strict=True):
        assert (g_fast is None) == (g_ref is None), label
        if g_ref is not None:
            assert rel_err(g_fast, g_ref) < 1e-6, label


def test_the_c_kernel_runs_when_enabled_and_not_when_disabled(monkeypatch):
    """The C path is really taken (its backward node differs in nothing visible, so count calls)."""
    if cpu_kernel._compiler() is None:
        pytest.skip("no C compiler on this machine")
    monkeypatch.delenv("ATTNRES_CPU_KERNEL", raising=False)
    calls = []
    real = depth_kernels.forward_c
    monkeypatch.setattr(depth_kernels, "forward_c", lambda *a: calls.append(1) or real(*a))
    res, emb, _, steps = build("attnres_paper", 7, d=8, seed=1)
    res(emb, steps).sum().backward()
    assert calls
    calls.clear()
    monkeypatch.setenv("ATTNRES_CPU_KERNEL", "0")
    res(emb, steps)
    assert not calls


def test_the_triton_kernel_runs_when_asked_for_and_not_otherwise(monkeypatch):
    """On CPU the Triton path is taken only when asked for (ATTNRES_TRITON_KERNEL=1, in the interpreter);
    on CUDA tensors by default."""
    pytest.importorskip("triton")
    from attnres.model import gpu_kernel

    calls = []
    real = depth_kernels.forward_triton
    monkeypatch.setattr(depth_kernels, "forward_triton", lambda *a: calls.append(1) or real(*a))
    res, emb, _, steps = build("block_hybrid_memory", 7, d=8, seed=1)
    monkeypatch.setenv("ATTNRES_TRITON_KERNEL", "1")
    res(emb, steps).sum().backward()
    assert calls and depth_attend.kernel_path("cpu") == "triton (interpreter)"
    calls.clear()
    for setting in ("auto", "0"):
        monkeypatch.setenv("ATTNRES_TRITON_KERNEL", setting)
        res(emb, steps)
        assert not calls and not gpu_kernel.applies([emb])


def test_a_failed_build_falls_back_to_pytorch_with_one_warning(tmp_path, monkeypatch, caplog):
    """No working compiler: one warning, and depth attention still trains (the PyTorch path)."""
    monkeypatch.delenv("ATTNRES_CPU_KERNEL", raising=False)
    monkeypatch.setenv("ATTNRES_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    cpu_kernel._load.cache_clear()
    cpu_kernel._warn_once.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="attnres.model.cpu_kernel"):
            assert cpu_kernel.kernel([torch.zeros(1)]) is None
            res, emb, _, steps = build("control_block", 7, d=8, seed=2)
            out = res(emb, steps)
            assert rel_err(out, reference_forward(res, emb, steps)) < 1e-6
        assert len([r for r in caplog.records if "PyTorch path" in r.getMessage()]) == 1
        assert "pytorch" in cpu_kernel.status()
    finally:
        cpu_kernel._load.cache_clear()
        cpu_kernel._warn_once.cache_clear()


def test_the_reference_is_not_trivially_equal_when_parameters_differ():
    """Guard: the comparison above can fail (a perturbed query changes the reference's output)."""
    res, emb, _, steps = build("control_block", 7, d=8, seed=0)
    before = reference_forward(res, emb, steps)
    with torch.no_grad():
        res.query[3].add_(1.0)
    assert rel_err(res(emb, steps), before) > 1e-3


@pytest.mark.parametrize("name", DEPTH)
def test_bf16_autocast_training_step_runs_and_stays_close_to_float32(name):
    """Under autocast the layers compute in bf16 and depth attention in float32; a step trains."""
    from attnres.model.gpt import GPT
    from attnres.variants.registry import resolve_run

    cfg = resolve_run(name, "tiny", 0, ["vocab_size=97", "d_model=32", "n_head=2", "seq_len=16", "n_layer=5"])
    torch.manual_seed(0)
    model = GPT(cfg.model)
    idx = torch.randint(0, 97, (2, 16))
    _, ref = model(idx, idx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx, idx)
    loss.backward()
    assert abs(float(loss) - float(ref)) < 0.05 * float(ref)
    grads = [p.grad for p in model.residual.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", ["control_block", "block_hybrid_memory", "block_value_proj"])
def test_torch_compile_traces_a_whole_model_on_the_triton_path_as_one_graph(name, monkeypatch):
    """The Triton kernel is a custom op: torch.compile keeps the model one graph with no break (the
    value-projection and hybrid variants pass a tensor as several sources: it goes in once)."""
    pytest.importorskip("triton")
    from attnres.model.gpt import GPT
    from attnres.variants.registry import resolve_run

    monkeypatch.setenv("ATTNRES_TRITON_KERNEL", "1")
    torch._dynamo.reset()
    cfg = resolve_run(name, "tiny", 1, ["n_layer=4", "d_model=32", "n_head=2", "seq_len=16", "vocab_size=64"])
    explained = torch._dynamo.explain(GPT(cfg.model))(torch.randint(0, 64, (2, 16)))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_the_triton_kernel_tiles_tokens_and_channels_as_the_pytorch_path_computes(monkeypatch):
    """Several token tiles and d_model chunks, both ends masked (37 tokens, 80 channels: tiles of 16, chunks
    of 64), every feature of the contract (shared and per-source queries with bias and scales, per-token
    queries, a prior with projected values): forward and every gradient equal the PyTorch path's in
    float64. (The self-check the kernel runs before its first use on a device, at float64.)"""
    pytest.importorskip("triton")
    monkeypatch.setenv("ATTNRES_CPU_KERNEL", "0")  # the reference is the PyTorch path
    assert depth_attend.triton_self_check(torch.device(DEVICE), torch.float64) < 1e-12


def test_the_triton_kernel_checks_itself_once_per_device_and_a_failing_one_is_not_used(monkeypatch, capfd):
    """Before its first real call on a device the kernel is compared with the PyTorch path on a small
    problem; one that fails there (here: a launch with no channel block) leaves depth attention on the
    PyTorch path, with one line saying so, and training goes on."""
    pytest.importorskip("triton")
    from attnres.model import gpu_kernel

    monkeypatch.setenv("ATTNRES_TRITON_KERNEL", "1")
    depth_attend._triton_checked.cache_clear()
    assert depth_attend.triton_self_check(torch.device(DEVICE)) < 1e-5
    assert depth_attend.kernel_path(DEVICE).startswith("triton")
    depth_attend._triton_checked.cache_clear()
    monkeypatch.setattr(gpu_kernel, "BLOCK_D", 0)
    try:
        res, emb, _, steps = build("control_block", 7, d=8, seed=1)
        res(emb, steps).sum().backward()  # trains, on the PyTorch path
        assert "using the PyTorch path" in capfd.readouterr().err
        assert depth_attend.kernel_path(DEVICE).startswith("pytorch (the Triton kernel failed its self-check")
    finally:
        depth_attend._triton_checked.cache_clear()  # (the verdict is kept per process: not for the next test)
