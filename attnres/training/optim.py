"""The optimizer: AdamW whose weight-decay groups follow what each parameter is, not its shape.

Weight decay pulls a parameter toward 0. That regularises a weight matrix, but it would pull a norm
gain or a depth-attention key gain away from its neutral value 1, and a depth query toward the
uniform softmax, whatever their shape. (The depth-attention tables are (sites x d) matrices: a
shape rule decayed them, which flattens the depth softmax over a long run.) So every parameter
declares a *role* and the role decides the group; a parameter without a role is an error, so a new
component cannot land in a group by accident.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a model is at hand: `attnres variants` prints RULE without it
    import torch
    from torch import nn

#: role -> weight decay applies. Modules name the roles of their own parameters in ``PARAM_ROLES``;
#: ``nn.Linear`` and ``nn.Embedding`` are known here.
DECAYED: dict[str, bool] = {
    "weight": True,  # linear layers' weight matrices
    "embedding": True,  # the token embedding (tied to the output head)
    "query_factor": True,  # block_input_dep_query's low-rank query factors
    "value_proj": True,  # block_value_proj's value-projection delta
    "norm": False,  # RMSNorm gains
    "bias": False,
    "key_gain": False,  # depth attention: the key norm's gains
    "query": False,  # depth attention: the (pseudo-)queries
    "alibi_slope": False,  # depth attention: ALiBi slopes
}

RULE = ("Weight decay applies to weight matrices: linear layers, the tied embedding, the low-rank query "
        "factors of block_input_dep_query and the value-projection delta of block_value_proj. It never applies "
        "to norm gains, key gains, depth queries, ALiBi slopes or biases, whatever their shape.")


def parameter_roles(model: nn.Module) -> dict[str, str]:
    """Every distinct parameter's name (tied weights under their first name) and its role."""
    from torch import nn

    roles: dict[str, str] = {}
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        declared: dict[str, str] = getattr(module, "PARAM_ROLES", {})
        for p_name, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            if p_name in declared:
                role = declared[p_name]
            elif isinstance(module, nn.Linear | nn.Embedding):
                role = {"bias": "bias"}.get(p_name, "embedding" if isinstance(module, nn.Embedding) else "weight")
            else:
                raise ValueError(f"parameter {name} ({type(module).__name__}) has no role: add it to PARAM_ROLES")
            if role not in DECAYED:
                raise ValueError(f"parameter {name} has unknown role '{role}'")
            roles[name] = role
    return roles


def decay_groups(model: nn.Module) -> dict[bool, list[str]]:
    """Parameter names with (True) and without (False) weight decay."""
    groups: dict[bool, list[str]] = {True: [], False: []}
    for name, role in parameter_roles(model).items():
        groups[DECAYED[role]].append(name)
    return groups


#: the Optimizer methods torch guards with ``torch._disable_dynamo`` (a bookkeeping call, not a step)
_GUARDED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


@functools.cache
def eager_adamw() -> type[torch.optim.AdamW]:
    """torch's AdamW, doing the same arithmetic, without importing torch._dynamo when nothing is compiled.

    torch.optim guards its bookkeeping methods with ``torch._disable_dynamo`` and ``step`` with two
    ``torch._dynamo.graph_break()`` calls, so the first call of any of them imports torch._dynamo: 1.7-1.9 s
    of every trainer's start on a 2-core CPU, as long as importing torch itself, for guards that act
    only while dynamo traces the optimizer. An eager run never does, so this subclass calls the
    methods that torch's decorators wrap (``__wrapped__``, kept by ``functools.wraps``) and keeps the
    step's one effect outside tracing: gradients off unless the optimizer is differentiable. Should a
    torch release stop exposing a wrapped method, the plain AdamW is returned: slower to start, never
    different. ``tests/test_optim.py`` checks both give identical weights and that a step imports no dynamo.
    """
    import torch

    base = torch.optim.AdamW
    methods = {name: getattr(getattr(torch.optim.Optimizer, name), "__wrapped__", None) for name in _GUARDED}
    step = getattr(base.step, "__wrapped__", None)
    if step is None or None in methods.values():
        return base

    def eager_step(self: torch.optim.AdamW, closure=None):  # noqa: ANN001, ANN202 - torch's signature
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, closure)

    eager_step.__doc__ = base.step.__doc__
    return type("EagerAdamW", (base,), {**methods, "step": eager_step, "__doc__": base.__doc__})


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                    fused: bool = False, compiled: bool = False) -> torch.optim.Optimizer:
    """AdamW with two groups: decayed (weight_decay) and not (0), chosen by :func:`decay_groups`.

    ``compiled`` (the model goes through torch.compile) keeps torch's own class and its dynamo guards;
    otherwise :func:`eager_adamw` saves a trainer the import of torch._dynamo.
    """
    import torch

    params = dict(model.named_parameters())  # tied weights appear once, under their first name
    groups = decay_groups(model)
    adamw = torch.optim.AdamW if compiled else eager_adamw()
    return adamw(
        [{"params": [params[n] for n in groups[True] if params[n].requires_grad], "weight_decay": weight_decay},
         {"params": [params[n] for n in groups[False] if params[n].requires_grad], "weight_decay": 0.0}],
        lr=lr, betas=betas, fused=fused)
