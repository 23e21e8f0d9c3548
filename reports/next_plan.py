"""What's Next, as a plan: the runs that resolve the open comparisons, what is still running, what was
never run, and a retry that differs for what failed. Pure: the document's comparisons and runs in, a plan
out; the report prints it and ``attnres next --launch`` launches exactly its runs, recording the seeds
it planned per comparison (a pre-registration the next report holds the test to).

Seeds are chosen to pair: an arm first takes the seeds other variants of the scope already have (the
same seed sees the same data order), then fresh ones; the cells of all comparisons are merged, so the
baseline's seeds serve every comparison that needs them, and grouped into as few launch commands as
their seed lists allow. A comparison is tested paired only when its arms hold the same seeds, so arms that
do get the same new seeds (:mod:`reports.pairs`): seeds added to the baseline are added to every arm that
holds the baseline's seeds, and the never-run variants get the baseline's seeds as they will be after the
plan. A comparison whose pairing is lost, or cannot be made, is named with the reason.
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
from dataclasses import dataclass, field

import pandas as pd

from attnres import run_settings
from attnres.config import get_preset
from attnres.errors import AttnresError
from attnres.reports.escape import cell_text
from attnres.reports.evidence import BASELINE, CONTRAST, TOP_TWO, Comparison, evidence_text
from attnres.reports.pairs import plan_seeds, seed_order, seeds_text
from attnres.reports.scope import DEFAULT_DATA, Scope
from attnres.reports.stats import shown
from attnres.reports.tables import cause, ended_step
from attnres.runs import DEFAULT_BACKEND, grid, planning
from attnres.tracking.states import ACTIVE, DIVERGED, FAILED, FINISHED, PREEMPTED, RUNNING
from attnres.variants.registry import VARIANTS, resolve_run

RESOLVE, RUNNING_ITEM, NEW, RETRY = "resolve", "running", "new", "retry"
KINDS = (RESOLVE, NEW, RETRY)  # what --launch can start
PILOT = 3  # seeds per arm when no arm has a spread to plan from
MAX_SEEDS = 10  # seeds per arm a plan asks for at most (--max-seeds)


@dataclass
class Launch:
    """One ``attnres launch`` of a plan: these variants x these seeds, with the scope's settings."""

    kind: str
    variants: list[str]
    seeds: list[int]
    overrides: list[str]  # --set items (a swept one: lr=a,b)

    def argv(self, scope: Scope, db: list[str] | None = None) -> list[str]:
        argv = ["attnres", "launch", *self.variants, "--seeds", *map(str, self.seeds), "--preset", scope.preset,
                "--steps", str(scope.budget), *(db or [])]
        if scope.experiment != scope.preset:
            argv += ["--experiment", scope.experiment]
        if scope.data != DEFAULT_DATA:
            argv += ["--data", scope.data]
        for item in self.overrides:
            argv += ["--set", item]
        return argv


@dataclass
class Item:
    kind: str
    lines: list[str] = field(default_factory=list)  # what it is, with its figures
    launches: list[Launch] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)  # other commands (resume, report --tuned)


@dataclass
class Plan:
    scope: Scope
    items: list[Item]
    registration: list[dict]  # per planned comparison: variant, against, n per arm, kind
    db: list[str] = field(default_factory=list)  # ["--db", URL] when not the default database
    imported: bool = False  # the scope's runs were recorded elsewhere: their settings are not known here

    def launches(self, kinds: tuple[str, ...] = KINDS) -> list[Launch]:
        return [x for item in self.items if item.kind in kinds for x in item.launches]

    def cells(self, kinds: tuple[str, ...] = KINDS) -> list[tuple[str, int, str]]:
        """The runs the launches of ``kinds`` start: (variant, seed, swept --set values), one per run (a swept
        setting, as a retry's ``lr=a,b``, is a run per value)."""
        return [(v, s, ",".join(f"{k}={val}" for k, val in cell.items())) for x in self.launches(kinds)
                for cell in grid.cells(grid.split_sweeps(x.overrides)[1]) for v in x.variants for s in x.seeds]

    def shown(self, kinds: tuple[str, ...] = KINDS) -> list[Item]:
        """The items ``attnres next --only KINDS`` prints: those parts alone, so every launch command it prints is
        one that ``--launch`` with the same ``--only`` starts; unfiltered, every item (the runs in progress too)."""
        return [i for i in self.items if i.kind in kinds or (i.kind == RUNNING_ITEM and set(kinds) >= set(KINDS))]

    def commands(self, item: Item) -> list[list[str]]:
        """An item's commands, each with this plan's database."""
        return [x.argv(self.scope, self.db) for x in item.launches] + [[*c, *self.db] for c in item.commands]

    def requests(self, kinds: tuple[str, ...] = KINDS, backend: str = DEFAULT_BACKEND) -> list[planning.LaunchRequest]:
        """What ``attnres next --launch`` starts: the launches of ``kinds`` on ``backend``, checked as ``attnres
        launch`` checks."""
        if self.imported:
            raise AttnresError("the runs of this scope were imported (recorded elsewhere, their settings unknown "
                               "here): launch the printed commands yourself if they train what they trained")
        s = self.scope
        return [planning.request(x.variants, x.seeds, s.preset, s.budget, x.overrides, s.data,
                                 backend=backend, experiment=s.experiment) for x in self.launches(kinds)]

    def registration_of(self, kinds: tuple[str, ...] = KINDS) -> dict:
        """The pre-registration a launch of ``kinds`` records: the comparisons and their planned seeds."""
        return {"comparisons": [p for p in self.registration if p["kind"] in kinds]}


def kinds(only: list[str] | None) -> tuple[str, ...]:
    """``--only`` parts of a plan (default: all that can be launched); one clear line for an unknown one."""
    for k in only or []:
        if k not in KINDS:
            raise AttnresError(f"--only {k}: choose from {', '.join(KINDS)}")
    return tuple(only or KINDS)


def settings_of(runs: pd.DataFrame, variant: str, reference: str, scope: Scope) -> list[str] | None:
    """The ``--set`` items that train ``variant`` as its runs (or ``reference``'s) were trained in ``scope``
    (:func:`attnres.runs.planning.reproduce`); [] for imported runs (the preset's own settings: a plan of them
    is printed, not launched); None when no command can reproduce them."""
    src = runs[runs["variant"] == variant]
    src = src if len(src) else runs[runs["variant"] == reference]
    if src.empty:
        return []
    run = src.iloc[-1]
    if "model" not in json.loads(run["config_json"] or "{}"):
        try:
            get_preset(scope.preset)
        except AttnresError:
            return None
        return []
    return planning.reproduce(run["config_json"], run["config_hash"], scope.preset, int(run["seed"]),
                              scope.budget, scope.experiment)


def _usable(runs: pd.DataFrame) -> dict[str, set[int]]:
    """Per variant, the seeds whose runs finished or are going (they will give a value)."""
    ok = runs[runs["status"].isin([FINISHED, *ACTIVE, PREEMPTED])]
    return {str(v): set(g["seed"].astype(int)) for v, g in ok.groupby("variant")}


def _group(picks: dict[str, list[int]], kind: str, settings: dict[str, list[str] | None]) -> list[Launch]:
    """As few launch commands as the seed lists allow: variants with the same seeds (and settings) share one."""
    by: dict[tuple, list[str]] = {}
    for variant, seeds in picks.items():
        if seeds and settings.get(variant) is not None:
            by.setdefault((tuple(seeds), tuple(settings[variant])), []).append(variant)
    return [Launch(kind, variants, list(seeds), list(sets)) for (seeds, sets), variants in by.items()]


POWER_PURPOSE, PILOT_PURPOSE = "power 0.8", "pilot"  # what a planned comparison's seeds are for (registered)
WIDER = 4  # seeds per arm a pilot is widened to when the spread rests on fewer (3 degrees of freedom for its bound)


def planned_count(c: Comparison, max_seeds: int) -> tuple[float, str]:
    """Seeds per arm a plan gives an open comparison, and what for; inf where no count within ``max_seeds`` can
    promise power 0.8. Without a spread: a pilot of :data:`PILOT`. A spread from fewer than :data:`WIDER` seeds
    has an upper bound several times itself (7.9x from 2 seeds), so a count that fits at the spread as observed
    may not fit at the bound: the pilot is widened to :data:`WIDER` seeds first, to measure the spread, and the
    comparison is planned again from there (it promises no power yet, and says so)."""
    if c.need != c.need:
        return PILOT, f"a pilot of {PILOT} seeds per arm, to estimate the spread"
    if not math.isinf(c.need) and c.need <= max_seeds:
        return c.need, f"{int(c.need)} seeds per arm"
    held = min(len(c.values_a), len(c.values_b))
    if held < WIDER <= max_seeds and c.need_observed == c.need_observed and c.need_observed <= max_seeds:
        return WIDER, (f"a wider pilot of {WIDER} seeds per arm first, to measure the spread: from {held} seeds its "
                       f"90% upper bound asks for more than {max_seeds} (--max-seeds); planned again from there")
    return math.inf, ""


def _resolve(tests: list[Comparison], runs: pd.DataFrame, max_seeds: int, settings: dict[str, list[str] | None],
             pairs: list[tuple[str, str]]) -> tuple[Item, list[dict], dict[str, list[int]]]:
    """The runs that resolve the open comparisons (``pairs``: every comparison tested, kept paired where their
    arms hold the same seeds), the pre-registration of the comparisons they add seeds to, and the new seeds per
    arm."""
    item, targets, planned = Item(RESOLVE), {}, []
    usable = _usable(runs)
    for c in tests:
        if c.kind not in (BASELINE, TOP_TWO) or c.resolved:
            continue
        delta = f"Δ {shown(c.delta):+.3f}, " if math.isfinite(c.delta) else ""
        head = f"{c.a} vs {c.b} ({c.kind}, {delta}{c.seeds()} seeds): {evidence_text(c)}"
        if c.waiting:
            item.lines.append(f"{head}. Tested when the runs it waits for finish.")
            continue
        n, why = planned_count(c, max_seeds)
        if math.isinf(n):
            observed = (f" (~{c.need_observed:,.0f} would do if σ is as observed, which from {len(c.values_a)} "
                        "seeds is as likely too small as too large)") if c.need_observed <= max_seeds else ""
            item.lines.append(f"{head}. Not planned: no count within {max_seeds} seeds per arm (--max-seeds) can "
                              f"promise power 0.8 for this Δ{observed}; a larger --max-seeds plans it, or the Δ is "
                              "too small to resolve at a cost worth paying.")
            continue
        n = int(n)
        for v in (c.a, c.b):
            targets[v] = max(targets.get(v, 0), n, len(usable.get(v, ())))
        item.lines.append(f"{head}. Planned: {why}.")
        planned.append({"variant": c.a, "against": c.b, "kind": RESOLVE,
                        "purpose": POWER_PURPOSE if c.need <= max_seeds else PILOT_PURPOSE})  # (NaN: a pilot)
    seeds = plan_seeds(runs, usable, targets, pairs, [(p["variant"], p["against"]) for p in planned], max_seeds,
                       {v: settings.get(v) is not None for pair in pairs for v in pair})
    picks = seeds.picks
    item.lines += seeds.lines
    planned += [{"variant": a, "against": b, "kind": RESOLVE} for a, b in seeds.kept
                if (a, b) in {(c.a, c.b) for c in tests} and not any({a, b} == {p["variant"], p["against"]}
                                                                       for p in planned)]
    for p in planned:
        p["n"] = [len(usable.get(p[k], ())) + len(picks.get(p[k], [])) for k in ("variant", "against")]
    item.launches = _group(picks, RESOLVE, settings)
    if any(settings.get(v) is None for v, seeds in picks.items() if seeds):
        item.lines.append("No command: the runs were recorded at a preset or with settings this attnres cannot "
                          "train again; add the seeds where they were trained.")
    return item, [p for p in planned if any(picks.get(p[k]) for k in ("variant", "against"))], picks


def _eta(run: pd.Series) -> str:
    if run["status"] == PREEMPTED:
        return "preempted (it continues from its checkpoint when resumed)"
    if run["status"] != RUNNING:
        return str(run["status"])
    started, beat = run.get("started_at"), run.get("heartbeat_at")
    if pd.isna(started) or pd.isna(beat) or not run["step"]:
        return "ETA unknown (no timing recorded)"
    pace = (beat - started).total_seconds() / run["step"]
    left = pace * (run["total_steps"] - run["step"])
    hours, minutes = divmod(int(left // 60), 60)
    return f"ETA ~{hours} h {minutes:02d} min" if hours else f"ETA ~{max(1, minutes)} min"


def _running(runs: pd.DataFrame) -> Item:
    item = Item(RUNNING_ITEM)
    going = runs[runs["status"].isin([*ACTIVE, PREEMPTED])].sort_values(["variant", "seed"])
    for _, r in going.iterrows():
        item.lines.append(f"{r['variant']} s{r['seed']}: step {int(r['step']):,} of {int(r['total_steps']):,}, "
                          f"{_eta(r)}")
        if r["status"] == PREEMPTED:  # (`attnres resume` continues it through the backend it ran on)
            item.commands.append(["attnres", "resume", str(r["id"])])
    return item


def never_run(runs: pd.DataFrame, scope: Scope, baseline: str) -> tuple[list[str], list[str]]:
    """Registry variants with no run in this scope: (those buildable at its preset, those refused there)."""
    fresh, refused = [], []
    present = {str(x).split("@")[0] for x in runs["variant"]}  # (a sweep's cells as arms: their variant ran)
    for v in VARIANTS:
        if v in present:
            continue
        try:
            resolve_run(v, scope.preset, 0, experiment=scope.experiment)
        except AttnresError:
            refused.append(v)
            continue
        fresh.append(v)
    return fresh, refused


def _new(runs: pd.DataFrame, scope: Scope, baseline: str, settings: dict[str, list[str] | None],
         added: list[int] | None = None) -> tuple[Item, list[dict]]:
    """The never-run variants, at the baseline's seeds as they will be once ``added`` (the seeds the plan's
    resolve part adds to the baseline, when it is launched too) are: the same seeds, so each pairs with it."""
    item = Item(NEW)
    have = _usable(runs).get(baseline, set())
    seeds = [s for s in itertools.islice(seed_order(runs), len(set(runs["seed"]))) if s in have] or [42]
    added = [s for s in added or [] if s not in seeds]
    seeds += added
    try:
        get_preset(scope.preset)
    except AttnresError:
        return item, []  # (a preset of runs recorded elsewhere: nothing can be built here)
    fresh, refused = never_run(runs, scope, baseline)
    if fresh:
        also = f", and {seeds_text(added)}, which resolving the open comparisons adds to it" if added else ""
        item.lines.append(f"Never run in this scope: {', '.join(fresh)}; planned with {baseline}'s seeds "
                          f"({seeds_text(seeds[:len(seeds) - len(added)])}{also}), so they pair.")
        if settings.get(baseline) is not None:
            item.launches = [Launch(NEW, fresh, seeds, list(settings[baseline]))]
    if refused:
        item.lines.append(f"Not buildable at preset {scope.preset}: {', '.join(refused)} (`attnres variants`).")
    return item, [{"variant": v, "against": baseline, "n": [len(seeds), len(seeds)], "kind": NEW} for v in fresh]


def _retry(runs: pd.DataFrame, scope: Scope, baseline: str, settings: dict[str, list[str] | None]) -> Item:
    item = Item(RETRY)
    usable = _usable(runs)
    for variant, grp in runs[runs["status"].isin([FAILED, DIVERGED])].groupby("variant", sort=True):
        for _, r in grp.iterrows():
            why = cell_text(cause(r))
            item.lines.append(f"{variant} s{r['seed']} {r['status']} at step {ended_step(r):,} ({why}).")
            if r["status"] == FAILED and variant in usable:
                item.commands.append(["attnres", "resume", str(r["id"])])
        if variant in usable or settings.get(variant) is None:
            continue
        lr = _lr(grp, scope.preset)
        values = ",".join(run_settings.normal(lr / k) for k in (2, 4))
        base = [o for o in settings[variant] if not o.startswith("lr=")]
        item.lines.append(f"{variant} has no run that finished: retry at a smaller learning rate ({values} instead "
                          f"of {run_settings.normal(lr)}), as a sweep with {baseline}, so each is compared at its best "
                          "(a sweep: `attnres report` then keeps its cells apart, and `--tuned lr` compares each "
                          "variant at its best value).")
        item.launches.append(Launch(RETRY, [variant, baseline], sorted(set(grp["seed"].astype(int))),
                                    [*base, f"lr={values}"]))
        item.commands.append(["attnres", "report", *shlex.split(scope.flags()), "--tuned", "lr"])
    return item


def _lr(runs: pd.DataFrame, preset: str) -> float:
    lr = run_settings.settings(runs["config_json"].iloc[-1]).get("lr")
    return float(lr) if lr is not None else float(get_preset(preset).train.lr)


def make(tests: list[Comparison], runs: pd.DataFrame, scope: Scope, baseline: str,
         max_seeds: int = MAX_SEEDS, db: list[str] | None = None, kinds: tuple[str, ...] = KINDS) -> Plan:
    """The plan for one scope, from its tested comparisons and its runs (``db``: the --db its commands name;
    ``kinds``: the parts to be launched: the never-run variants get the seeds the resolve part adds to the
    baseline only when it is launched too)."""
    settings = {v: settings_of(runs, v, baseline, scope) for v in [*VARIANTS, *set(runs["variant"])]}
    resolve, planned, picks = _resolve([c for c in tests if c.kind != CONTRAST], runs, max_seeds, settings,
                                       [(c.a, c.b) for c in tests])
    added = picks.get(baseline) if RESOLVE in kinds and settings.get(baseline) is not None else None
    new, fresh = _new(runs, scope, baseline, settings, added)
    imported = all("model" not in json.loads(c or "{}") for c in runs["config_json"])  # recorded elsewhere
    if imported and (resolve.launches or new.launches):
        resolve.lines.append(f"These runs were imported: the commands train at preset {scope.preset}'s own "
                             "settings on the built-in data; run them only where that is how the imported runs "
                             "were trained (`attnres next --launch` does not launch them).")
    items = [resolve, _running(runs), new, _retry(runs, scope, baseline, settings)]
    return Plan(scope, [i for i in items if i.lines or i.launches], planned + fresh, list(db or []), imported)


TITLES = {RESOLVE: "Resolve the open comparisons", RUNNING_ITEM: "Runs in progress", NEW: "Variants never run here",
          RETRY: "Failed or diverged runs"}


def markdown(plan: Plan) -> str:
    parts = ["## What's Next\n",
             "Generated from the statistics above. `attnres next` prints this plan; `attnres next --launch` "
             "launches its runs as one stage and records the seeds it planned per comparison, which the report "
             "then tests as planned (a look of its own: see Statistical Evidence).\n"]
    for i, item in enumerate(plan.items, 1):
        parts.append(f"{i}. **{TITLES[item.kind]}**")
        parts += [f"   - {line}" for line in item.lines]
        parts += [f"   - `{shlex.join(c)}`" for c in plan.commands(item)]
    return "\n".join(parts) + "\n"
