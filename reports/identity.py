"""Arms that trained the same model: two names are not two models.

A variant's name is a claim about what was trained. Runs whose recorded configs are identical but for the seed
(the model, its residual wiring, the training and the data) trained one model under two names; a deep variant
launched before its shape rule applied to ``--set`` trained the shallow model, for one. Such an arm is named as
the same model as the other and left out of rankings and test families: a Δ between two names of one model is
seed noise, not evidence. Pure: a runs frame in, a mapping out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd

from attnres.variants.registry import VARIANTS

# what makes a run's training: everything recorded but the seed and the names it is filed under
_TRAINED = ("model", "train", "data")


def _trained(config_json: object) -> str | None:
    """The part of a recorded config that decides what is trained, as canonical text (None: imported, no config)."""
    try:
        config = json.loads(config_json) if isinstance(config_json, str) and config_json else {}
    except ValueError:
        return None
    if "model" not in config:
        return None
    return json.dumps({k: config.get(k) for k in _TRAINED}, sort_keys=True)


def same_models(runs: pd.DataFrame, prefer: Sequence[str] = ()) -> dict[str, str]:
    """{arm: the arm it trained the same model as}, over the variants of ``runs``: an arm whose every run has
    one recorded training config, equal to an earlier arm's. Earlier: the names in ``prefer`` first (a
    comparison's reference), then the registry's order (standard before its deep forms), then any other name."""
    if runs.empty or "config_json" not in runs:
        return {}
    trained: dict[str, str] = {}
    for variant, grp in runs.groupby("variant", sort=False):
        found = {_trained(c) for c in grp["config_json"]}
        if len(found) == 1 and None not in found:
            trained[str(variant)] = found.pop()
    order = list(dict.fromkeys([*[p for p in prefer if p in trained], *[v for v in VARIANTS if v in trained],
                                *sorted(trained)]))
    first: dict[str, str] = {}
    out: dict[str, str] = {}
    for variant in order:
        key = trained[variant]
        if key in first:
            out[variant] = first[key]
        else:
            first[key] = variant
    return out


def same_as(mark: object) -> str:
    """The arm a table row's mark names as its model's other name ('' where it names none)."""
    text = mark if isinstance(mark, str) else ""
    head = next((part for part in text.split("; ") if part.startswith(_SAME)), "")
    return head[len(_SAME):].split(":")[0]


_SAME = "Same model as "


def note(same_as: str) -> str:
    """The words an arm that trained another arm's model carries (a table's footnote, a comparison's evidence)."""
    return f"{_SAME}{same_as}: identical recorded model, training and data; left out of rankings and tests"
