"""Plans that keep pairs paired (issue 45, section 4).

`attnres next --launch` once added seeds 1-6 to standard only, so block_hybrid_memory vs standard, paired on seeds
42 and 1337, fell back to Welch's test; the Multi-Seed section then showed "paired ... p = 0.0156" beside the
decision's Welch p of 0.263. A plan now adds the same seeds to every arm that holds the same seeds as an arm it adds
seeds to (or names the comparison that loses its pairing, and why), and the document says which test decides.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import arms_csv, cli_here
from scipy import stats

from attnres.reports import pairs
from attnres.reports.bench import evidence_rows
from attnres.reports.build import next_plan, write_report
from attnres.reports.evidence import METHOD
from attnres.reports.next_plan import KINDS, NEW, RESOLVE, Plan
from attnres.tracking.run_store import RunStore

BASE = {42: 3.000, 1337: 3.020, 7: 2.990}
# block_hybrid_memory: far ahead, paired on standard's seeds; control_block: a small step ahead, with some spread
# in its differences, so that resolving it against standard takes more seeds than it has
HYBRID = {s: v - 0.100 - 0.001 * i for i, (s, v) in enumerate(BASE.items())}
CONTROL = {42: 2.985, 1337: 3.015, 7: 2.980}
# a plan's seed counts rest on σ's upper confidence bound from 2-3 seeds: many seeds, allowed here
MAX = 100


def imported(workdir: Path, arms: dict[str, dict[int, float]]) -> RunStore:
    """The arms imported as finished runs of preset tiny (so that a plan has commands to print)."""
    path = arms_csv(workdir, arms)
    frame = pd.read_csv(path)
    frame["preset"] = "tiny"
    frame.to_csv(path, index=False)
    cli_here("import", path, check=True)
    return RunStore(str(workdir / "runs.db"))


def after(plan: Plan, held: dict[str, dict[int, float]], kinds: tuple[str, ...] = KINDS) -> dict[str, set[int]]:
    """Each arm's seeds once the plan's runs of ``kinds`` have run: those it holds and those planned for it."""
    seeds = {v: set(s) for v, s in held.items()}
    for variant, seed, _ in plan.cells(kinds):
        seeds.setdefault(variant, set()).add(seed)
    return seeds


def paired_before(held: dict[str, dict[int, float]]) -> list[tuple[str, str]]:
    return [(a, b) for a, b in itertools.combinations(sorted(held), 2) if set(held[a]) == set(held[b])]


def test_seeds_added_to_the_baseline_go_to_every_arm_that_holds_its_seeds(workdir):
    held = {"standard": BASE, "block_hybrid_memory": HYBRID, "control_block": CONTROL}
    store = imported(workdir, held)
    plan = next_plan(store, max_seeds=MAX)
    final = after(plan, held)
    assert final["standard"] > set(BASE)  # the plan adds seeds to the baseline (control_block vs standard)...
    for a, b in paired_before(held):  # ...and to every arm paired with it: no comparison falls back to Welch's
        assert final[a] == final[b], (a, b, final)
    # the never-run variants get the baseline's seeds as they will be after the plan, so they pair too
    fresh = {v for v, _, _ in plan.cells((NEW,))}
    assert fresh and all(final[v] == final["standard"] for v in fresh)
    shown = cli_here("next", "--max-seeds", str(MAX), check=True).stdout
    added = sorted(final["standard"] - set(BASE))
    assert f"block_hybrid_memory gets the same new seeds as control_block, standard ({pairs.seeds_text(added)})" \
        in shown
    assert "block_hybrid_memory vs standard" in shown and "tested paired" in shown
    assert f"planned with standard's seeds (7, 42, 1337, and {pairs.seeds_text(added)}, which resolving" in shown
    assert "loses its pairing" not in shown


def test_without_the_resolve_part_the_never_run_variants_take_the_baselines_seeds_of_now(workdir):
    """`--only new` launches no seed of the baseline: the never-run variants get the seeds it holds now (then
    `--only resolve` later adds its new seeds to them as well: they hold the baseline's seeds)."""
    held = {"standard": BASE, "block_hybrid_memory": HYBRID, "control_block": CONTROL}
    store = imported(workdir, held)
    plan = next_plan(store, max_seeds=MAX, kinds=(NEW,))
    final = after(plan, held, (NEW,))
    assert final["standard"] == set(BASE)
    fresh = {v for v, _, _ in plan.cells((NEW,))}
    assert fresh and all(final[v] == set(BASE) for v in fresh)
    shown = cli_here("next", "--only", "new", "--max-seeds", str(MAX), check=True).stdout
    assert "planned with standard's seeds (7, 42, 1337), so they pair." in shown  # (most shared first)
    whole = next_plan(store, max_seeds=MAX)  # the whole plan: the baseline and its arms get the same seeds
    assert after(whole, held)["standard"] > set(BASE)
    everything = after(whole, held)
    assert all(everything[v] == everything["standard"] for v in fresh)


def test_a_comparison_that_lost_its_pairing_is_paired_again(workdir):
    """The state the issue left: standard at 42, 1337 and 1-6, block_hybrid_memory at 42 and 1337 only (Welch's
    test). Planned from the paired differences of the seeds they share, the plan gives block_hybrid_memory the
    seeds standard holds and it lacks, so the comparison is paired again."""
    rng = np.random.default_rng(7)
    base = {s: 3.0 + float(rng.normal(0, 0.02)) for s in (42, 1337, 1, 2, 3, 4, 5, 6)}
    held = {"standard": base, "block_hybrid_memory": {42: base[42] - 0.010, 1337: base[1337] - 0.012}}
    store = imported(workdir, held)
    plan = next_plan(store, max_seeds=MAX)
    final = after(plan, held, (RESOLVE,))
    assert final["block_hybrid_memory"] == final["standard"] >= set(base)
    shown = cli_here("next", "--max-seeds", str(MAX), check=True).stdout
    assert "(paired once each arm holds the other's seeds" in shown
    assert f"block_hybrid_memory vs standard becomes paired: both arms will hold the same " \
           f"{len(final['standard'])} seeds" in shown
    registered = {(p["variant"], p["against"]): p["n"] for p in plan.registration_of((RESOLVE,))["comparisons"]}
    assert registered[("block_hybrid_memory", "standard")] == [len(final["standard"])] * 2


def test_the_document_says_which_test_decides_when_arms_share_some_seeds(workdir):
    """Partly shared seeds: Welch's test over every seed decides; the paired test over the shared seeds is shown
    beside it, labelled as not deciding. Arms with the same seeds: the paired test decides, Welch's is shown."""
    base = {42: 3.000, 1337: 3.020, 1: 2.980, 2: 3.010, 3: 2.995}
    hybrid = {42: 2.990, 1337: 3.009}  # 2 of standard's 5 seeds
    control = {s: v - 0.004 + 0.001 * (s % 3) for s, v in base.items()}  # standard's seeds
    store = imported(workdir, {"standard": base, "block_hybrid_memory": hybrid, "control_block": control})
    text = write_report(store, workdir / "r.md", plots=False)
    assert "Arms that share only some of their seeds get Welch's test over every seed of each arm, and that is " \
           "the test that decides" in METHOD and METHOD in text
    rows = {r["Comparison"]: r for r in evidence_rows(text)}
    hybrid_row = rows["block_hybrid_memory vs standard"]
    assert hybrid_row["Test"] == "Welch (2 shared seeds, not all)"
    welch = stats.ttest_ind(list(hybrid.values()), list(base.values()), equal_var=False).pvalue
    paired = stats.ttest_rel([hybrid[s] for s in (42, 1337)], [base[s] for s in (42, 1337)]).pvalue
    assert hybrid_row["p"] == f"{welch:.3g}"  # the decision's p is Welch's over all seeds...
    line = next(ln for ln in text.splitlines() if ln.startswith("Δ vs standard") and "(2 vs 5 seeds)" in ln)
    # ...and the Multi-Seed line labels it so, the paired p over the 2 shared seeds as shown only
    assert re.search(rf"Welch t = [-0-9.]+, p = {welch:.4f} \(the evidence's test: the arms share 2 of their "
                     r"seeds, not all\)", line), line
    assert "paired over 2 shared seed(s): Δ" in line and f"p = {paired:.4f} (shown only: it leaves out" in line
    assert rows["control_block vs standard"]["Test"] == "paired (5 pairs)"
    line = next(ln for ln in text.splitlines() if ln.startswith("Δ vs standard") and "(5 vs 5 seeds)" in ln)
    assert "(shown only); paired over 5 shared seed(s)" in line
    assert "(the evidence's test: the arms hold the same seeds)" in line


# -- reports.pairs alone: the lines that name a comparison a plan cannot keep paired --------------------------
def _runs(held: dict[str, set[int]]) -> pd.DataFrame:
    return pd.DataFrame([{"variant": v, "seed": s} for v, seeds in held.items() for s in seeds])


def test_a_comparison_that_loses_its_pairing_is_named_with_the_reason():
    held = {"standard": {42, 1337}, "control_block": {42, 1337}, "block_hybrid_memory": {42, 1337}}
    got = pairs.plan_seeds(_runs(held), held, {"control_block": 5, "standard": 5},
                           [("control_block", "standard"), ("block_hybrid_memory", "standard")],
                           [("control_block", "standard")], 10,
                           {"standard": True, "control_block": True, "block_hybrid_memory": False})
    assert got.picks["standard"] == got.picks["control_block"] == got.picks["block_hybrid_memory"] == [1, 2, 3]
    assert any(line.startswith("block_hybrid_memory vs standard loses its pairing (then Welch's test over all "
                               "seeds of each arm): no command here trains block_hybrid_memory again")
               for line in got.lines), got.lines


def test_a_pairing_beyond_max_seeds_is_left_apart_and_said():
    held = {"standard": {1, 2, 3, 4}, "control_block": {5, 6, 7, 8}, "block_hybrid_memory": {1, 2, 3, 4}}
    got = pairs.plan_seeds(_runs(held), held, {"control_block": 6, "standard": 6},
                           [("control_block", "standard"), ("block_hybrid_memory", "standard")],
                           [("control_block", "standard")], 6, dict.fromkeys(held, True))
    assert "control_block vs standard stays unpaired (Welch's test): pairing it would take the 8 seeds its arms " \
           "hold between them, more than --max-seeds 6 per arm." in got.lines
    assert got.picks["standard"] == got.picks["block_hybrid_memory"]  # those two stay paired
    assert not set(got.picks["control_block"]) & (held["control_block"])


@pytest.mark.parametrize("seeds,text", [([42, 1337, 1, 2, 3, 4], "42, 1337, 1–4"), ([7], "7"), ([1, 2], "1, 2")])
def test_seeds_text(seeds, text):
    assert pairs.seeds_text(seeds) == text


def test_a_spread_from_two_seeds_widens_the_pilot_before_promising_power(workdir):
    """Two seeds per arm: the spread of their one paired difference has a 90% upper bound 7.9 times itself, and
    the count planned at it (~35) passes --max-seeds 10 where the count at the spread as observed (~4) does not.
    The plan widens the pilot to 4 seeds per arm to measure the spread, registered as a pilot (no power
    promised), rather than giving up on the comparison."""
    held = {"standard": {1: 3.000, 2: 3.020}, "control_block": {1: 2.980, 2: 3.005}}
    store = imported(workdir, held)
    plan = next_plan(store, kinds=(RESOLVE,))
    c = next(x for x in plan_comparisons(store) if x.a == "control_block")
    assert not c.resolved and c.need > 10 >= c.need_observed
    assert after(plan, held, (RESOLVE,)) == {"standard": {1, 2, 3, 4}, "control_block": {1, 2, 3, 4}}
    registered = plan.registration_of((RESOLVE,))["comparisons"]
    assert [(p["variant"], p["against"], p["n"], p["purpose"]) for p in registered] == [
        ("control_block", "standard", [4, 4], "pilot")]
    shown = cli_here("next", "--only", "resolve", check=True).stdout
    assert "Planned: a wider pilot of 4 seeds per arm first, to measure the spread" in shown


def plan_comparisons(store: RunStore) -> list:
    """The comparisons of the store's document (the report's own analysis, resolve part only)."""
    from attnres.reports.build_study import next_analysis

    return next_analysis(store, kinds=(RESOLVE,))[1].tests
