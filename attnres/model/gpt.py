"""A GPT-2-style decoder: token embedding, RoPE, causal SDPA attention, SwiGLU, RMSNorm, tied head.

One readable file in the spirit of nanoGPT's model.py. The residual path is not written here:
the model turns its layers into a list of depth steps and hands them to the residual module
chosen by ``config.residual`` (see :mod:`attnres.model.residual`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnres.config import ModelConfig
from attnres.model.residual import build_residual


class RMSNorm(nn.Module):
    PARAM_ROLES: ClassVar[dict[str, str]] = {"weight": "norm"}  # no weight decay (attnres.training.optim)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin tables of shape (seq_len, head_dim/2) for rotary position embedding, on the default device.

    The positions are counted on the CPU and the tables moved: ``arange`` on the meta device (where ``attnres
    variants --params`` and every report build models to count their parameters) goes through torch's Python
    reference ops, whose first use imports ``torch._dynamo`` (about 1 s of each report)."""
    cpu = torch.device("cpu")
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=cpu) / head_dim))
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=cpu), inv)
    device = torch.get_default_device()
    return ang.cos().to(device), ang.sin().to(device)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs of x (B, H, T, hd) by position."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Layer(nn.Module):
    """One transformer layer, exposed as two sublayer steps or one whole-layer step.

    As a whole-layer step it returns its contribution ``a + m(x + a)``, so a standard residual
    reproduces the usual pre-norm block ``x + a + m(x + a)``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def attn_step(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return self.attn(self.attn_norm(x), cos, sin)

    def mlp_step(self, x: Tensor) -> Tensor:
        return self.mlp(self.mlp_norm(x))

    def layer_step(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        a = self.attn_step(x, cos, sin)
        return a + self.mlp_step(x + a)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))
        self.residual = build_residual(cfg.residual, cfg.d_model, cfg.depth_steps, cfg.norm_eps)
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02), output projections scaled by 1/sqrt(2L).

        The residual module's own parameters keep the init they were built with (zero queries,
        unit gains, zero deltas) so that step 0 is a uniform average over depth.
        """
        for name, p in self.named_parameters():
            if name.startswith("residual.") or p.dim() < 2:
                continue
            std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith(("proj.weight", "down.weight")) else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def steps(self) -> list[Callable[[Tensor], Tensor]]:
        """The depth steps, in order, that the residual module combines."""
        rope = {"cos": self.rope_cos, "sin": self.rope_sin}
        if self.cfg.residual.granularity == "sublayer":
            return [s for layer in self.layers
                    for s in (partial(layer.attn_step, **rope), layer.mlp_step)]
        return [partial(layer.layer_step, **rope) for layer in self.layers]

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        h = self.residual(self.embed(idx), self.steps())
        logits = self.head(self.norm(h))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def num_params(self) -> dict[str, int]:
        """Unique parameter counts (tied weights once): total, without the (tied) token embedding, and the
        residual path's extra."""
        total = sum(p.numel() for p in self.parameters())
        extra = sum(p.numel() for p in self.residual.parameters())
        return {"total": total, "non_embedding": total - self.embed.weight.numel(), "residual_extra": extra}
