"""Hyperparameter grids: ``--set key=a,b`` expanded into cells, and the cell a recorded run belongs to.

A launch's ``--set lr=3e-4,1e-3`` sweeps ``lr``; several swept keys make a product, and every cell is
trained for every variant and seed. The same seed gives every cell the same data order and the same
initial weights (both are functions of the seed alone), so cells compare paired by seed.

Which settings a recorded grid sweeps is read from the runs themselves, not from how they were
launched: a setting is *swept* where one variant's runs (in one experiment, preset, budget and
dataset) hold more than one value of it. So a grid launched in two commands, or extended later, is
one grid, and runs of different settings are never pooled as seeds of one variant.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Mapping, Sequence

from attnres.errors import AttnresError
from attnres.run_settings import normal, swept_keys


def split_sweeps(overrides: Iterable[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``--set`` items as (fixed items, swept key -> its values); one clear line for a malformed list."""
    fixed: list[str] = []
    swept: dict[str, list[str]] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or "," not in value:
            fixed.append(item)
            continue
        values = [v.strip() for v in value.split(",")]
        if not key or any(not v for v in values):
            raise AttnresError(f"bad --set '{item}': a swept setting is KEY=A,B,... with no empty value")
        if len({normal(v) for v in values}) != len(values):
            raise AttnresError(f"bad --set '{item}': a value is given twice")
        if key in swept:
            raise AttnresError(f"--set sweeps {key} twice: give all its values in one list")
        swept[key] = values
    for item in fixed:
        if item.partition("=")[0] in swept:
            raise AttnresError(f"--set {item.partition('=')[0]} is both fixed and swept: give it once")
    return fixed, swept


def cells(swept: Mapping[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the swept values, in the order given ([{}] when nothing is swept)."""
    keys = list(swept)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(swept[k] for k in keys))]


def label(values: Mapping[str, str], keys: Iterable[str]) -> str:
    """A cell's name from a run's settings: ``lr=0.001 warmup=10`` ('' when nothing is swept)."""
    return " ".join(f"{k}={values[k]}" for k in keys if k in values)


def cell_labels(groups: Sequence[Hashable], variants: Sequence[str], values: Sequence[Mapping[str, str]],
                exclude: str | None = None) -> list[str]:
    """Each run's cell: the values of the settings (all but ``exclude``) swept among the runs of its group.

    ``groups`` says, per run, what a sweep is found within (status: experiment, preset and budget; a
    report's scope also the dataset); ``variants`` and ``values`` (:func:`settings`) are the runs'.
    """
    members: dict[Hashable, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    labels = [""] * len(groups)
    for rows in members.values():
        keys = [k for k in swept_keys((variants[i], values[i]) for i in rows) if k != exclude]
        for i in rows:
            labels[i] = label(values[i], keys)
    return labels


def parse_pick(items: Iterable[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` filters of report/compare/status: the cell's values, normalised."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value or "," in value:
            raise AttnresError(f"bad --set '{item}': pick one cell with KEY=VALUE, e.g. --set lr=1e-3")
        out[key] = normal(value)
    return out


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """A compared arm: ``VARIANT`` or a cell of it, ``VARIANT@KEY=VALUE[,KEY=VALUE...]`` (values normalised).
    One clear line for a malformed one."""
    name, sep, cell = text.partition("@")
    if not sep:
        return name, {}
    hint = "give VARIANT@KEY=VALUE[,KEY=VALUE], e.g. control_block@lr=1e-3"
    pick: dict[str, str] = {}
    for item in cell.split(","):
        key, eq, value = item.strip().partition("=")
        if not name or not eq or not key or not value or "@" in value:
            raise AttnresError(f"bad arm '{text}': {hint}")
        if key in pick:
            raise AttnresError(f"bad arm '{text}': {key} is given twice")
        pick[key] = normal(value)
    return name, pick


def arm_label(variant: str, pick: Mapping[str, str]) -> str:
    """An arm's name in tables and figures: ``control_block`` or ``control_block@lr=0.001``."""
    return variant + ("@" + ",".join(f"{k}={v}" for k, v in pick.items()) if pick else "")
