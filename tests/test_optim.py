"""Weight decay follows what a parameter is: every parameter of every variant, by name, in its group."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from attnres.model.gpt import GPT
from attnres.training.optim import build_optimizer, decay_groups, parameter_roles
from attnres.variants.registry import VARIANTS, resolve_run

LAYER_MATRIX = re.compile(r"layers\.\d+\.(attn\.qkv|attn\.proj|mlp\.gate_up|mlp\.down)\.weight")
NORM = re.compile(r"(layers\.\d+\.(attn_norm|mlp_norm)\.weight|norm\.weight)")
DEPTH = {"residual.query": False, "residual.key_gain": False, "residual.alibi_slope": False,
         "residual.query_down": True, "residual.query_up": True, "residual.value_delta": True}


def expected_decay(name: str) -> bool:
    """The rule written out by name: weight matrices decay; norms, gains, queries and slopes do not."""
    if name == "embed.weight" or LAYER_MATRIX.fullmatch(name):
        return True
    if NORM.fullmatch(name):
        return False
    return DEPTH[name]  # a KeyError here is a parameter this test does not know: name it above


def tiny(name: str) -> GPT:
    torch.manual_seed(0)
    return GPT(resolve_run(name, "tiny", 0, ["vocab_size=97", "d_model=32", "n_head=2", "seq_len=16",
                                              "n_layer=4"]).model)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_parameter_is_in_the_group_its_role_says(name):
    model = tiny(name)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    group_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    names = dict(model.named_parameters())  # the tied head is the embedding, listed once
    assert len(group_of) == len(names) == sum(len(g["params"]) for g in opt.param_groups)
    for pname, p in names.items():
        assert group_of[id(p)] == (0.1 if expected_decay(pname) else 0.0), pname
    if VARIANTS[name].residual.kind == "depth":  # the depth tables are matrices, and still not decayed
        assert names["residual.query"].dim() == 2 and names["residual.key_gain"].dim() == 2
        assert {"residual.query", "residual.key_gain"} <= set(decay_groups(model)[False])


def test_decay_pulls_matrices_toward_zero_and_leaves_gains_and_queries_alone():
    """One AdamW step with no gradient: only decayed parameters move (toward 0)."""
    model = tiny("block_input_dep_query")
    with torch.no_grad():
        model.residual.query.fill_(0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, lr=0.1, weight_decay=0.5, betas=(0.9, 0.95))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    for n in ["residual.key_gain", "residual.query", "norm.weight", "layers.0.attn_norm.weight"]:
        assert torch.equal(after[n], before[n]), n
    for n in ["residual.query_down", "layers.0.attn.qkv.weight", "embed.weight"]:
        assert torch.allclose(after[n], before[n] * (1 - 0.1 * 0.5)), n


def test_a_parameter_without_a_role_is_refused():
    model = tiny("standard")
    model.residual.register_parameter("mystery", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(ValueError, match=r"residual\.mystery.*no role"):
        parameter_roles(model)


@pytest.mark.integration
def test_the_eager_optimizer_gives_torchs_adamw_weights_exactly_and_imports_no_dynamo():
    """Three steps and a checkpoint round trip through both classes: identical weights and state; and in a
    fresh process, a trainer's optimizer calls never import torch._dynamo (1.7-1.9 s of its start)."""
    models = [tiny("block_hybrid_memory") for _ in range(2)]
    opts = [build_optimizer(m, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), compiled=c)
            for m, c in zip(models, (False, True), strict=True)]
    assert type(opts[0]).__name__ == "EagerAdamW" and type(opts[1]) is torch.optim.AdamW
    x = torch.randint(0, 97, (2, 16))
    for step in range(3):
        for m, o in zip(models, opts, strict=True):
            m(x, x)[1].backward()
            o.step()
            o.zero_grad(set_to_none=True)
            if step == 1:
                o.load_state_dict(o.state_dict())
    for (n, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b), n
        assert all(torch.equal(opts[0].state[a][k], opts[1].state[b][k]) for k in opts[1].state[b]), n
    code = ("import sys, torch\nfrom attnres.training.optim import build_optimizer\nm = torch.nn.Linear(3, 3)\n"
            "o = build_optimizer(m, 1e-3, 0.1, (0.9, 0.95))\nm(torch.ones(3)).sum().backward()\no.step()\n"
            "o.zero_grad()\no.load_state_dict(o.state_dict())\nprint('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
