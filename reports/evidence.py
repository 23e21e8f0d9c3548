"""How sure each comparison a document makes is: pure functions from tables of runs to test results.

Three rules keep a document's "resolved" honest (see :data:`METHOD`):

* **Stages and looks.** The runs of one ``attnres launch`` (or ``next --launch``, or one import) are
  a stage. A comparison is tested on the seeds of complete stages only: while a stage that adds seeds
  to either arm is still running, the test waits for it (the earlier stages' result stands). Every
  stage that added seeds to a testable comparison is one more *look* at its data.
* **Sequential testing.** Look ``k`` may spend α/2^k, so any number of looks spends at most α in all:
  adding seeds until p < 0.05 cannot make a comparison resolved. A test's p-value is carried as
  ``min(1, p * 2^k)`` into the family.
* **Family-wise control.** Holm–Bonferroni (:func:`reports.stats.holm`) over each family's tests:
  the *primary* family is every variant against the baseline and the two best variants against each
  other; the Interpretation's contrasts between two variants are the *secondary* family.

The test is paired (per-seed differences) when both arms hold the same seeds, Welch's otherwise.
Seeds per arm to resolve come from an exact power calculation (noncentral t, power 0.8) for the test
the next look will make (paired when the arms hold the same seeds) at the level it will
face in its family (α/2^k / m, Holm's strictest step), with the spread at its 90% upper confidence bound
(a spread from few seeds is as often too small as too large: planned at it as observed, a plan delivers far
less than the power it states; ``attnres bench errors`` measures the power plans deliver).

* **One error rate for the document.** The two families share α = 0.05: the primary family is tested at
  0.04 and the contrasts at 0.01 (Bonferroni across families, Holm within each), so the chance that a
  document with no true difference calls anything resolved is at most 5%.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from attnres.reports.stats import (
    ALPHA,
    PAIRED,
    WELCH,
    decision_confidence,
    design,
    flat,
    holm,
    interval,
    level_text,
    seed_plan,
    shown,
    test_p,
)
from attnres.reports.stats import need_text as _need_text
from attnres.reports.tables import num
from attnres.tracking.states import ACTIVE, PREEMPTED

PRIMARY, SECONDARY = "primary", "secondary"
BASELINE, TOP_TWO, CONTRAST = "vs baseline", "top two", "contrast"
RESOLVED, CONTRADICTED, SUGGESTIVE, UNTESTABLE = "resolved", "contradicted", "suggestive", "not yet testable"
INCONCLUSIVE = "inconclusive"
# an unresolved test leans (SUGGESTIVE) when its own p, before looks and Holm, is below this: its (1 - LEAN)
# interval excludes 0. With no true difference that happens to at most this share of comparisons.
LEAN = 0.10

#: each family's share of the document's α: Bonferroni across the two families keeps the chance of any false
#: "resolved" in a document at α, Holm within each keeps its power. The primary family (each variant against
#: the baseline, the top two) is what the document decides; the contrasts explain it, and get the smaller share.
SHARE = {PRIMARY: 0.8, SECONDARY: 0.2}


METHOD = ("Tests: on the eval loss of the seeds of complete stages, a paired t-test over the per-seed differences "
          "when both arms hold the same seeds (same seed, same data order), else Welch's t-test (a stage is the runs "
          "of one launch; while one is still running, a comparison it adds seeds to waits for it). Arms that share "
          "only some of their seeds get Welch's test over every seed of each arm, and that is the test that decides: "
          "a paired test over the shared seeds alone would leave the others out (the Multi-Seed section shows it "
          "beside Welch's, for information only); `attnres next` adds the same new seeds to arms that hold the same "
          "seeds, so a paired comparison stays paired, and names any comparison a plan cannot keep paired. A test "
          "decides only at the runs' last step: one at an earlier step (partial, --step, or a run that ended early) is "
          "interim and resolves nothing, as each eval step would otherwise be one more look. Each stage that added "
          "seeds to a testable comparison is one more look, and look k may spend α/2^k, so that any number of looks "
          "spends at most its family's α in all (a p-value enters as min(1, p·2^k)). One error rate for the whole "
          f"document, α = {ALPHA:g}, split between two families (Bonferroni): Holm–Bonferroni at α = "
          f"{ALPHA * SHARE[PRIMARY]:g} over the primary family (each variant against the baseline, and the two best "
          f"against each other) and, separately, at α = {ALPHA * SHARE[SECONDARY]:g} over the Interpretation's "
          "contrasts, so that with no true difference "
          "anywhere the document calls something resolved at most 5% of the time. Arms without any spread are "
          "untested (the p-value would be 0 for any Δ). The Δ interval is the test's own (paired or Welch) at "
          "the level its decision uses, 1 − α·p/(adjusted p), so it excludes 0 exactly when the comparison is "
          "resolved (an interim or untested one: at the level its next decision will face); the Δ figure's band "
          "is the same interval at every step. Seeds per arm to resolve: exact power 0.8 (noncentral t) at "
          "the level the comparison's next decision will face, α/2^k divided by its family's size once the plan's "
          "never-run variants join it, for the observed Δ and the test it will face: paired (σ of the per-seed "
          "differences) when the arms hold the same 2+ seeds, as a plan adds the same seeds to both, or share 2+ seeds "
          "(a plan then gives each arm the seeds the other holds: the σ of the shared seeds' differences, for at least "
          "the seeds the two hold between them); otherwise Welch "
          "with the arms' spread (or the scope's pooled seed spread when neither arm has two seeds). A spread from a "
          "few seeds is as often too small as too large, and a plan resting on it as observed delivers less power than "
          "it states, so the count is planned at σ's 90% upper confidence bound (chi-square) and given at σ as "
          "observed beside it (`attnres bench errors` measures the power plans deliver). "
          "Evidence classes (the Interpretation's): *resolved* or *contradicted* (resolved, lower or higher than the "
          "design expects); an unresolved (or interim) test is *suggestive* when its own p-value at its latest look, "
          f"before looks and Holm, is below {LEAN:.2f} (its unadjusted {1 - LEAN:.0%} interval excludes 0: the data "
          f"lean one way, and the sentence says which), else *inconclusive* (p ≥ {LEAN:.2f}: the data lean neither "
          f"way; with no true difference, a comparison is suggestive at most {LEAN:.0%} of the time); *not yet "
          "testable* without a test.")


@dataclass
class Look:
    n_a: int
    n_b: int
    p: float


@dataclass
class Comparison:
    """One test of a document: arm ``a`` against arm ``b`` at ``step``, and what came of it."""

    a: str
    b: str
    kind: str  # BASELINE, TOP_TWO or CONTRAST
    step: int
    partial: bool = False
    interim: bool = False  # before the runs' last step (partial, --step, or a run that ended early): no decision
    traits: list[str] = field(default_factory=list)  # CONTRAST: the traits a adds to b
    values_a: dict[int, float] = field(default_factory=dict)  # tested: seeds of complete stages
    values_b: dict[int, float] = field(default_factory=dict)
    waiting: list[tuple[str, int, int]] = field(default_factory=list)  # (variant, seed, step) of incomplete stages
    looks: list[Look] = field(default_factory=list)
    plan: dict | None = None  # the pre-registration of the latest planned stage for this pair
    plan_done: bool = False  # that stage is complete
    delta: float = math.nan
    p: float = math.nan
    p_seq: float = math.nan
    p_adj: float = math.nan
    resolved: bool = False
    need: float = math.nan  # seeds per arm to resolve
    need_observed: float = math.nan  # ... at the spread as observed (``need`` is at its upper bound)
    pooled: bool = False  # ``need`` rests on the scope's pooled spread
    design: str = WELCH  # the test of the latest look (PAIRED: the arms hold the same seeds)
    plan_design: str = WELCH  # the test ``need`` is planned for
    flat: bool = False  # neither arm has any spread: a difference of means without a test
    run_ids: list[int] = field(default_factory=list)  # the runs whose seeds are values_a and values_b
    ci: tuple[float, float] = (math.nan, math.nan)  # the interval of delta at ci_level, for the test made
    ci_level: float = 1 - ALPHA  # the level that agrees with the decision (:func:`reports.stats.decision_confidence`)

    @property
    def family(self) -> str:
        return SECONDARY if self.kind == CONTRAST else PRIMARY

    @property
    def look(self) -> int:
        return len(self.looks)

    @property
    def testable(self) -> bool:
        return math.isfinite(self.p)

    def seeds(self) -> str:
        return f"{len(self.values_a)} vs {len(self.values_b)}"


def stage_of(runs: pd.DataFrame) -> dict[int, int]:
    """Run id -> its stage (launch id; 0 for runs recorded before launches were)."""
    stage = runs["launch_id"] if "launch_id" in runs else pd.Series(0, index=runs.index)
    return dict(zip(runs["id"].astype(int), pd.to_numeric(stage, errors="coerce").fillna(0).astype(int), strict=True))


def _arms(row_a: pd.Series, row_b: pd.Series) -> list[tuple[int, int, float, int]]:
    """(arm 0/1, seed, value, run id) of every seed the two table rows hold."""
    return [(arm, int(seed), float(value), int(row["run_ids"][seed]))
            for arm, row in ((0, row_a), (1, row_b)) for seed, value in row["values"].items()]


def going(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs not at their step yet: going, or interrupted to go on (a preempted run resumes; ended ones are
    done)."""
    return runs[runs["status"].isin([*ACTIVE, PREEMPTED])]


def assess(c: Comparison, row_a: pd.Series, row_b: pd.Series, runs: pd.DataFrame,
           plans: Mapping[int, dict] | None = None, *, stage: Mapping[int, int] | None = None,
           live_runs: pd.DataFrame | None = None) -> Comparison:
    """Fill ``c`` from the two arms' table rows (:func:`reports.tables.per_variant`): the looks made by its
    complete stages and Δ and Welch's p at the latest; the plan that applies; what it waits for.

    While a stage is running, the earlier stages' look stands; without one, the figures shown (and a plan's
    seed count) are the seeds at the step so far, untested. ``stage`` (:func:`stage_of`) and ``live_runs``
    (:func:`going`) of ``runs``, when a document assesses many comparisons over the same runs: read once.
    """
    stage = stage_of(runs) if stage is None else stage
    live_runs = going(runs) if live_runs is None else live_runs
    seeds = _arms(row_a, row_b)
    held = {run_id for *_, run_id in seeds}
    live = live_runs[live_runs["variant"].isin([c.a, c.b]) & ~live_runs["id"].isin(held)]
    waiting_stages = {stage[int(r)] for r in live["id"]}
    order = sorted({stage[r] for *_, r in seeds} | waiting_stages)
    complete = []
    for s in order:  # the longest run of complete stages, oldest first
        if s in waiting_stages:
            break
        complete.append(s)
    c.waiting = sorted((str(r.variant), int(r.seed), int(r.step)) for r in live.itertuples())
    tested = [(arm, seed, value, stage[r]) for arm, seed, value, r in seeds if stage[r] in complete]
    for s in complete:
        a = {seed: v for arm, seed, v, st in tested if arm == 0 and st <= s}
        b = {seed: v for arm, seed, v, st in tested if arm == 1 and st <= s}
        if any(st == s for *_, st in tested) and len(a) >= 2 and len(b) >= 2:
            c.flat = flat(a, b)  # (the p-value would be 0 for any Δ: no test at all)
            c.design = design(a, b)
            c.looks.append(Look(len(a), len(b), math.nan if c.flat else test_p(a, b)))
    shown = tested if c.looks else [(arm, seed, value, 0) for arm, seed, value, _ in seeds]
    run_of = {(arm, seed): run_id for arm, seed, _, run_id in seeds}
    c.run_ids = sorted(run_of[(arm, seed)] for arm, seed, *_ in shown)
    c.values_a = {seed: v for arm, seed, v, _ in shown if arm == 0}
    c.values_b = {seed: v for arm, seed, v, _ in shown if arm == 1}
    if c.values_a and c.values_b:
        c.delta = float(np.mean(list(c.values_a.values())) - np.mean(list(c.values_b.values())))
    if c.looks:
        c.p = c.looks[-1].p
        c.p_seq = min(1.0, c.p * 2 ** c.look) if math.isfinite(c.p) else math.nan
    for s in reversed(order):
        plan = (plans or {}).get(s)
        match = [x for x in (plan or {}).get("comparisons", []) if {x["variant"], x["against"]} == {c.a, c.b}]
        if match:
            c.plan, c.plan_done = match[0], s in complete
            break
    return c


def pooled_sd(table: pd.DataFrame) -> tuple[float, int]:
    """The seed spread pooled over every variant with two or more seeds, and its degrees of freedom
    (NaN, 0 without any)."""
    num = den = 0.0
    for values, mark in zip(table["values"], table["mark"], strict=True):
        if mark or len(values) < 2:
            continue
        x = np.array(list(values.values()), dtype=float)
        num += float(np.var(x, ddof=1)) * (len(x) - 1)
        den += len(x) - 1
    return (math.sqrt(num / den), int(den)) if den else (math.nan, 0)


def family_alpha(family: str, alpha: float = ALPHA) -> float:
    """The α a family's Holm procedure is run at: its :data:`SHARE` of the document's."""
    return alpha * SHARE[family]


def control(comparisons: list[Comparison], sigma: tuple[float, int] = (math.nan, 0), alpha: float = ALPHA,
            future: int = 0) -> list[Comparison]:
    """Holm over each family's testable comparisons at the runs' last step (an interim one decides nothing), at
    the family's share of ``alpha``; then every comparison's seeds per arm to resolve, at the level its next look
    will face in its family, which ``future`` more primary comparisons (the plan's never-run variants) will have
    joined."""
    for family in (PRIMARY, SECONDARY):
        family_a = family_alpha(family, alpha)
        members = [c for c in comparisons if c.family == family]
        size = len(members) + (future if family == PRIMARY else 0)
        tested = [c for c in members if math.isfinite(c.p_seq) and not c.interim]
        if tested:
            reject, adjusted = holm([c.p_seq for c in tested], family_a)
            for c, r, q in zip(tested, reject, adjusted, strict=True):
                c.resolved, c.p_adj = bool(r), float(q)
        for c in members:
            # the next decision: this look if it is interim (or untested yet), else the next one
            level = family_a / 2 ** (c.look + (0 if c.interim and c.look else 1)) / size
            if not c.resolved:
                _plan_size(c, sigma, level)
            c.ci_level = decision_confidence(c.p, c.p_adj, family_a) if math.isfinite(c.p_adj) else 1 - level
            if c.looks:
                c.ci = interval(c.values_a, c.values_b, c.ci_level)
    return comparisons


def _plan_size(c: Comparison, sigma: tuple[float, int], level: float) -> None:
    size = seed_plan(c.values_a, c.values_b, c.delta, level, sigma, complete=True)  # (a plan completes the pairs)
    c.need, c.need_observed, c.plan_design = size["need"], size["observed"], str(size["design"])
    if c.plan_design == PAIRED and design(c.values_a, c.values_b) != PAIRED:
        c.plan_design += " once each arm holds the other's seeds"
    c.pooled = size["basis"] == "the pooled spread"


def evidence_class(c: Comparison) -> str:
    """RESOLVED (resolved lower: every trait's design expects a lower, or no higher, eval loss),
    CONTRADICTED (resolved higher), SUGGESTIVE (tested, unresolved or interim, and its own p-value below
    :data:`LEAN`: the data lean one way, the sentence says which), INCONCLUSIVE (tested, unresolved, p at or
    above :data:`LEAN`: they lean neither way) or UNTESTABLE."""
    if not c.testable:
        return UNTESTABLE
    if not c.resolved:
        return SUGGESTIVE if c.p < LEAN else INCONCLUSIVE
    return RESOLVED if c.delta < 0 else CONTRADICTED


def backs_lower(c: Comparison | None) -> bool:
    """The comparison resolved its first arm lower (better): what an unqualified verdict or star needs."""
    return c is not None and c.resolved and c.delta < 0


def need_text(c: Comparison, unit: str = "") -> str:
    """Seeds per arm to resolve, the test they are planned for, and the count at the spread as observed:
    '~9 (paired; power 0.8 with σ at its 90% upper bound; ~3 at σ as observed)'."""
    return _need_text(c.need, c.need_observed, c.plan_design + (" at the pooled spread" if c.pooled else ""), unit)


def seeds_text(c: Comparison) -> str:
    """'~9 seeds per arm (paired; power 0.8 with σ at its 90% upper bound; ~3 at σ as observed)'."""
    return need_text(c, " seeds per arm")


def evidence_text(c: Comparison) -> str:
    """The evidence a verdict or finding carries: resolved (Holm-adjusted p), unresolved (~n seeds per arm),
    interim (no decision before the last step), or untested; with the look, the plan and what it waits for."""
    n_a, n_b = len(c.values_a), len(c.values_b)
    if c.resolved:
        text = f"resolved (Holm-adjusted p = {c.p_adj:.3g})"
    elif c.testable and c.interim:
        text = f"interim at step {c.step:,}, no decision before the last step: {seeds_text(c)}"
    elif c.testable:
        text = f"unresolved: {seeds_text(c)}"
    elif c.waiting and not c.looks:
        text = "not tested yet"
    elif c.flat:
        text = f"untested ({c.seeds()} seeds): " + ("the paired differences do not vary" if c.design == PAIRED
                                                     else "no spread within either arm")
    elif n_a and n_b:
        need = seeds_text(c)
        if max(n_a, n_b) < 2:
            text = "one seed per arm: untested" + (f"; {need}" if c.need == c.need else "")
        else:
            text = f"untested ({c.seeds()} seeds)" + (f": {need}" if c.need == c.need else "")
    else:
        text = "untested: no eval of both at one step"
    extra = []
    if c.look > 1:
        extra.append(f"look {c.look}")
    if c.plan is not None:
        n = c.plan["n"] if c.plan["variant"] == c.a else c.plan["n"][::-1]
        extra.append(f"planned {n[0]} vs {n[1]}, " + (f"tested at {c.seeds()}" if c.plan_done else "running"))
    if c.waiting:
        extra.append("waits for " + ", ".join(f"{v} s{s} (step {st:,})" for v, s, st in c.waiting))
    return text + (f"; {'; '.join(extra)}" if extra else "")


def interval_text(c: Comparison) -> str:
    """'[-0.031, -0.004] (98.8%)': the Δ's interval at the level of its decision; it excludes 0 exactly when the
    comparison is resolved (an interim one at the level its decision will face); — where untested."""
    lo, hi = c.ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "—"
    return f"[{lo:+.3f}, {hi:+.3f}] ({level_text(c.ci_level)})"


def test_text(c: Comparison) -> str:
    """The test that decides: 'paired (3 pairs)', 'Welch', or 'Welch (2 shared seeds, not all)' where the arms
    share only some seeds (the paired test over those alone is not made: it would leave the others out)."""
    if not c.looks:
        return "—"
    if c.design == PAIRED:
        return f"paired ({len(c.values_a)} pairs)"
    shared = len(set(c.values_a) & set(c.values_b))
    return f"{WELCH} ({shared} shared seed{'s' if shared > 1 else ''}, not all)" if shared else WELCH


def table(comparisons: list[Comparison]) -> pd.DataFrame:
    """The document's Evidence table: every comparison, its numbers and its evidence (markdown-ready)."""
    return pd.DataFrame({
        "Comparison": [f"{c.a} vs {c.b}" for c in comparisons],
        "Kind": [c.kind + (f": {', '.join(c.traits)}" if c.traits else "") for c in comparisons],
        "Step": [f"{c.step:,}" + (" (partial)" if c.partial else "") for c in comparisons],
        "Seeds": [c.seeds() for c in comparisons],
        "Δ": [num(shown(c.delta), "+.3f") for c in comparisons],
        "Test": [test_text(c) for c in comparisons],
        "p": [num(c.p, ".3g") for c in comparisons],
        "Look": [str(c.look) if c.look else "—" for c in comparisons],
        "Holm-adjusted p": [num(c.p_adj, ".3g") for c in comparisons],
        "Δ interval": [interval_text(c) for c in comparisons],
        "Seeds per arm to resolve": [need_text(c) if not c.resolved else "—" for c in comparisons],
        "Evidence": [evidence_text(c) for c in comparisons],
    })
