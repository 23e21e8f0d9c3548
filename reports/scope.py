"""What one document compares: a scope (experiment, preset, step budget, dataset, cell of a sweep), and
for each comparison group the step it is compared at. Pure functions of the run and evals tables.

A table never mixes experiments, presets, step budgets, datasets (a loss per GPT-2 token and one per
byte are different numbers) or the values of a swept setting (runs at two learning rates are not
seeds of one variant: :mod:`attnres.runs.grid`): a document covers one scope, and names the others the
database holds. ``--tuned KEY`` joins the cells that differ only in KEY into one scope, where each
variant is then compared at its best value (:mod:`reports.tuning`).
Within it, each comparison group (the shallow variants; the deep variants with the shallow baseline)
is compared at its final step when its runs finished, else at the latest step its compared variants
have all reached, labelled partial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from attnres import run_settings
from attnres.reports.stats import ReportError, finite
from attnres.runs import grid
from attnres.tracking.states import EARLY, FINISHED

DEFAULT_DATA = "builtin"  # a run's dataset when none was named (not spelled out in labels)
KEYS = ["experiment", "preset", "budget", "dataset", "cell"]  # a scope's columns, as _keyed adds them


@dataclass(frozen=True)
class Asked:
    """Which scope a document, a plan or a study is of, as the user asked it (None: chosen from the database, the
    latest run's), and the baseline its Δs are measured against: built once by the CLI from its shared options,
    and handed down whole."""

    baseline: str = "standard"
    experiment: str | None = None
    preset: str | None = None
    budget: int | None = None
    data: str | None = None
    pick: dict[str, str] = field(default_factory=dict)  # a cell of a sweep (--set KEY=VALUE)
    tuned: str | None = None  # compare each variant at its best value of this swept setting (--tuned)


LATEST = Asked()  # no scope named: the latest run's, against standard


@dataclass(frozen=True)
class Scope:
    experiment: str
    preset: str
    budget: int  # the runs' step budget (total_steps)
    data: str = DEFAULT_DATA  # the prepared dataset the runs trained on
    cell: str = ""  # the swept settings' values, e.g. "lr=0.001" ('' when nothing is swept)
    tuned: str | None = None  # a setting each variant is compared at its best value of (--tuned)

    def flags(self) -> str:
        """The report flags that select this scope."""
        data = f" --data {self.data}" if self.data != DEFAULT_DATA else ""
        cell = "".join(f" --set {kv}" for kv in self.cell.split())
        tuned = f" --tuned {self.tuned}" if self.tuned else ""
        return f"--experiment {self.experiment} --preset {self.preset} --budget {self.budget}{data}{cell}{tuned}"

    def label(self) -> str:
        data = f", data {self.data}" if self.data != DEFAULT_DATA else ""
        cell = f", {self.cell}" if self.cell else ""
        tuned = f", each variant at its best {self.tuned}" if self.tuned else ""
        return f"experiment {self.experiment}, preset {self.preset}, {self.budget:,} steps{data}{cell}{tuned}"


def _keyed(runs: pd.DataFrame, tuned: str | None = None) -> pd.DataFrame:
    """The runs with their scope's own columns: budget, dataset (an imported run's dataset is not known,
    only the file it came from, so it counts as the default: importing in two files does not split a grid),
    their settings and their cell: the values of the settings swept within their experiment, preset,
    budget and dataset (all but ``tuned``)."""
    if "data" in runs:
        data = runs["data"].fillna(DEFAULT_DATA)
        data = data.where(~data.astype(str).str.startswith("imported:"), DEFAULT_DATA)
    else:
        data = DEFAULT_DATA
    runs = runs.assign(budget=runs["total_steps"].astype(int), dataset=data)
    values = [run_settings.settings(c) for c in runs["config_json"]] if "config_json" in runs else [{}] * len(runs)
    groups = list(zip(*(runs[k] for k in KEYS[:-1]), strict=True))
    return runs.assign(settings=values, cell=grid.cell_labels(groups, list(runs["variant"]), values, tuned))


def swept(runs: pd.DataFrame) -> list[str]:
    """The settings swept among ``runs`` (one scope's, before a cell is picked)."""
    values = [run_settings.settings(c) for c in runs["config_json"]] if "config_json" in runs else []
    return run_settings.swept_keys(zip(runs["variant"], values, strict=True))


def scopes(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per scope in the runs: experiment, preset, budget, dataset, runs, latest (largest run id)."""
    if runs.empty:
        return pd.DataFrame(columns=[*KEYS, "runs", "latest"])
    g = (runs if "cell" in runs else _keyed(runs)).groupby(KEYS)
    return g["id"].agg(runs="count", latest="max").reset_index().sort_values("latest", ascending=False,
                                                                            ignore_index=True)


def _scope(row: object, tuned: str | None = None) -> Scope:
    return Scope(str(row.experiment), str(row.preset), int(row.budget), str(row.dataset), str(row.cell), tuned)


def select(runs: pd.DataFrame, experiment: str | None = None, preset: str | None = None,
           budget: int | None = None, baseline: str | None = None, data: str | None = None,
           pick: dict[str, str] | None = None, tuned: str | None = None,
           members: list[str] | None = None) -> tuple[pd.DataFrame, Scope, list[Scope]]:
    """The runs of one scope (the filters', else the one with the most recent run), the scope, and
    every other scope of ``runs``, latest first. With ``baseline``, the newest scope that has runs of it
    is preferred (a lone variant launched last does not make the default report impossible). With
    ``members`` (the variants a compare names), only a scope holding runs of every one of them is chosen, the
    newest of those; none is one error saying where each variant's runs are.

    ``pick`` (``--set KEY=VALUE``) keeps the runs whose settings hold those values; ``tuned`` joins the
    cells that differ only in that setting (which must be swept there).
    """
    runs = _keyed(runs, tuned)
    picked = runs
    if pick:
        picked = picked[[run_settings.matches(v, pick) for v in picked["settings"]]]
    if data is not None:
        picked = picked[picked["dataset"] == data]
    if experiment is not None:
        picked = picked[picked["experiment"] == experiment]
    if preset is not None:
        picked = picked[picked["preset"] == preset]
    if budget is not None:
        picked = picked[picked["total_steps"] == budget]
    if picked.empty:
        asked = " and ".join([f"--{k} {v}" for k, v in (("experiment", experiment), ("preset", preset),
                                                        ("budget", budget), ("data", data)) if v is not None]
                             + [f"--set {k}={v}" for k, v in (pick or {}).items()])
        raise ReportError(f"no runs match {asked}" if asked else "no runs in the database: launch some first "
                          "(attnres launch ...)")
    found = scopes(picked)
    if members:
        found = holding(picked, members)
    if baseline is not None:
        has = scopes(picked[picked["variant"] == baseline])[KEYS]
        with_base = found.merge(has, on=KEYS)
        found = with_base if len(with_base) else found
    scope = _scope(next(found.itertuples()), tuned)
    others = [s for r in scopes(runs).itertuples() if (s := _scope(r)) != replace(scope, tuned=None)]
    inside = picked[(picked["experiment"] == scope.experiment) & (picked["preset"] == scope.preset)
                    & (picked["budget"] == scope.budget) & (picked["dataset"] == scope.data)
                    & (picked["cell"] == scope.cell)]
    if tuned is not None and tuned not in swept(inside):
        have = swept(inside)
        raise ReportError(f"--tuned {tuned}: {tuned} has one value in {replace(scope, tuned=None).label()}"
                          + (f" (swept there: {', '.join(have)})" if have else " (nothing is swept there)"))
    return inside.drop(columns=["budget", "dataset", "settings", "cell"]), scope, others


def holding(runs: pd.DataFrame, members: list[str]) -> pd.DataFrame:
    """The scopes (as :func:`scopes`) that hold runs of every one of ``members``, newest first; none is one
    error naming the scopes each member's runs are in."""
    keyed = runs if "cell" in runs else _keyed(runs)
    found = scopes(keyed)
    for name in members:
        found = found.merge(scopes(keyed[keyed["variant"] == name])[KEYS], on=KEYS)
    if found.empty:
        where = "; ".join(f"{name}: " + (", ".join(f"{_scope(r).label()} ({_scope(r).flags()})"
                                                  for r in scopes(keyed[keyed["variant"] == name]).itertuples())
                                        or "no runs")
                          for name in members)
        raise ReportError(f"no experiment, preset, budget and dataset holds runs of all of {', '.join(members)} "
                          f"({where})")
    return found


def scopes_of(found: pd.DataFrame) -> list[Scope]:
    """The scopes of a :func:`scopes` frame, in its order."""
    return [_scope(r) for r in found.itertuples()]


def select_arms(runs: pd.DataFrame, arms: list[tuple[str, dict[str, str]]], experiment: str | None = None,
                preset: str | None = None, budget: int | None = None, data: str | None = None,
                pick: dict[str, str] | None = None) -> tuple[pd.DataFrame, Scope]:
    """The runs of each compared arm (a variant, or a cell of it: ``control_block@lr=1e-3``) within one experiment,
    preset, budget and dataset (the filters', else the latest that holds every arm), with an ``arm`` column.

    ``pick`` (``--set``) applies to every arm, an arm's own values over it. Each arm must be one cell there: an
    arm that spans several (another setting swept too) is refused with their names, as it would pool runs of
    different settings as seeds.
    """
    keyed = _keyed(runs)
    for column, value in (("experiment", experiment), ("preset", preset), ("budget", budget), ("dataset", data)):
        if value is not None:
            keyed = keyed[keyed[column] == value]
    members = []
    for variant, own in arms:
        label = grid.arm_label(variant, own)
        want = {**(pick or {}), **own}
        mine = keyed[keyed["variant"] == variant]
        rows = mine[[run_settings.matches(v, want) for v in mine["settings"]]]
        if rows.empty:
            held = sorted({c for c in mine["cell"] if c})
            raise ReportError(f"no runs of {label}" + (f" (its cells: {', '.join(held)})" if held else ""))
        members.append(rows.assign(arm=label))
    together = pd.concat(members, ignore_index=True)
    groups = KEYS[:-1]
    held = together.groupby(groups)["arm"].nunique()
    full = held[held == len(arms)].index
    if not len(full):
        where = "; ".join(f"{label}: {', '.join(sorted({_scope(r).label() for r in g.itertuples()}))}"
                          for label, g in together.groupby("arm", sort=False))
        raise ReportError(f"the arms share no experiment, preset, budget and dataset ({where})")
    inside = together.set_index(groups).loc[full]
    latest = inside["id"].groupby(level=groups).max().idxmax()
    inside = together[[tuple(r) == tuple(latest) for r in together[groups].itertuples(index=False)]]
    for label, g in inside.groupby("arm", sort=False):
        cells = sorted(set(g["cell"]))
        if len(cells) > 1:
            variant = str(g["variant"].iloc[0])
            examples = ", ".join(grid.arm_label(variant, dict(kv.split("=", 1) for kv in c.split())) for c in cells)
            raise ReportError(f"{label} holds runs of {len(cells)} cells ({', '.join(cells)}): name one, e.g. "
                              f"{examples.split(', ')[0]} (its cells: {examples})")
    ids = inside.groupby("arm", sort=False)["id"].apply(frozenset)
    if ids.duplicated().any():
        same = [a for a, s in ids.items() if (ids == s).sum() > 1]
        raise ReportError(f"{' and '.join(same)} are the same runs: compare different variants or cells")
    first = inside.iloc[0]
    scope = Scope(str(first["experiment"]), str(first["preset"]), int(first["budget"]), str(first["dataset"]))
    return inside.drop(columns=["budget", "dataset", "settings", "cell"]), scope


@dataclass
class Choice:
    """Where a comparison group is compared, and what is not (yet) in it."""

    step: int
    final: bool  # every compared run finished and the step is their last
    compared: list[str]  # variants (baseline included) with an eval at the step
    asked: bool = False  # the step was given (--step), not chosen
    too_early: dict[str, int] = field(default_factory=dict)  # variant -> its runs' furthest step
    behind: list[tuple[str, int, int]] = field(default_factory=list)  # (variant, seed, step) of live runs without it


def _reach(runs: pd.DataFrame, evals: pd.DataFrame) -> dict[str, set[int]]:
    """Per variant, the eval steps that at least one of its live runs has."""
    live = runs[~runs["status"].isin(EARLY)]
    steps = finite(evals).groupby("run_id")["step"].apply(set).to_dict()
    out: dict[str, set[int]] = {}
    for run in live.itertuples():
        out.setdefault(run.variant, set()).update(steps.get(run.id, set()))
    return out


def choose(runs: pd.DataFrame, evals: pd.DataFrame, members: list[str], baseline: str,
           step: int | None = None) -> Choice | None:
    """The step a group (``members`` and ``baseline``) is compared at; None if the baseline has no eval after
    step 0 yet (too early: step 0 is the initialisation, never a comparison).

    The latest eval step of the baseline that at least half of the members with live runs have reached
    (so one straggler does not hold the rest back, nor one runner-ahead leave the rest out); with
    ``step`` given, that step. Members without an eval there are too early (with their furthest step).
    """
    if step == 0:
        raise ReportError("step 0 is the initialisation, before any training: nothing to compare there")
    runs = runs[runs["variant"].isin([*members, baseline])]
    asked = step is not None
    reach = {v: steps - {0} for v, steps in _reach(runs, evals).items()}  # (step 0 compares initialisations)
    base = reach.pop(baseline, set())
    if not base:  # every baseline run ended early: compare at its evals (they are marked)
        ended = runs[(runs["variant"] == baseline)]
        base = set(finite(evals).loc[lambda e: e["run_id"].isin(ended["id"]), "step"]) - {0}
    others = [v for v in members if v != baseline and v in reach]
    if step is None:
        if not base:
            return None
        need = math.ceil(len(others) / 2)
        ready_at = {s: [v for v in others if s in reach[v]] for s in sorted(base, reverse=True)}
        step = next((s for s, ready in ready_at.items() if len(ready) >= need), max(base))
    elif step not in base:
        raise ReportError(f"the baseline '{baseline}' has no eval loss at step {step}")
    live = runs[~runs["status"].isin(EARLY)]
    with_step = set(finite(evals).loc[lambda e: e["step"] == step, "run_id"])
    compared = [baseline, *[v for v in others if step in reach[v]]]
    choice = Choice(step, False, compared, asked=asked)
    for v in others:
        if step not in reach[v]:
            choice.too_early[v] = int(live.loc[live["variant"] == v, "step"].max())
    at = live[live["variant"].isin(compared)]
    for run in at.itertuples():
        if run.id not in with_step and run.status != FINISHED:
            choice.behind.append((run.variant, int(run.seed), int(run.step)))
    done = at[at["id"].isin(with_step)]
    choice.final = bool(len(done)) and bool((done["status"] == FINISHED).all()) and \
        bool((done["total_steps"] == step).all()) and not choice.behind and not choice.too_early
    return choice
