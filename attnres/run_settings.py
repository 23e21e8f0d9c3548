"""A recorded run's settings: the ``--set`` names and canonical values that make its cell.

Pure functions over a run's recorded config (JSON), below every layer that reads runs: the database's
queries by cell (:mod:`attnres.tracking`), an ``--on-end`` command's environment, a variant's defaults
(:mod:`attnres.variants.registry`) and the grids of :mod:`attnres.runs.grid` all use them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

#: config entries that do not make a cell: who the run is (variant, seed, scope), the variant's revision
#: (reports set earlier revisions aside), and bookkeeping that changes neither what is trained nor what is measured
NOT_SETTINGS = frozenset({"variant", "seed", "preset", "experiment", "data", "revision", "compile", "compile_cuda",
                          "log_every", "checkpoint_every"})


def normal(value: object) -> str:
    """A setting's value as one canonical string: ``1e-3``, ``0.001`` and ``0.0010`` are the same value."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else format(value, ".6g")
    text = str(value).strip()
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return normal(number) if not (isinstance(number, float) and not math.isfinite(number)) else text
    return text.lower() if text.lower() in {"true", "false"} else text


def settings(config_json: str | None) -> dict[str, str]:
    """A recorded config's settings by their ``--set`` names (normalised values; bookkeeping left out)."""
    try:
        config = json.loads(config_json or "{}")
    except ValueError:
        return {}
    out: dict[str, str] = {}

    def walk(d: Mapping[str, object]) -> None:
        for key, value in d.items():
            if isinstance(value, Mapping):
                walk(value)
            elif key not in NOT_SETTINGS:
                out[key] = normal(value)

    if isinstance(config, Mapping) and "model" in config:  # (an imported run has no model config to compare)
        walk(config)
    return out


def swept_keys(runs: Iterable[tuple[str, Mapping[str, str]]]) -> list[str]:
    """The settings swept among ``(variant, settings)`` pairs: more than one value within one variant."""
    seen: dict[tuple[str, str], set[str]] = {}
    for variant, values in runs:
        for key, value in values.items():
            seen.setdefault((variant, key), set()).add(value)
    return sorted({key for (_, key), values in seen.items() if len(values) > 1})


def matches(values: Mapping[str, str], pick: Mapping[str, str]) -> bool:
    """Whether a run's settings hold every picked value."""
    return all(values.get(k) == v for k, v in pick.items())
