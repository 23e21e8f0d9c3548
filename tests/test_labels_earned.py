"""Every label is earned (issue 45, section 2): the clause after a verdict is the evidence for that verdict
(*Best quality*: its test against the second, then the baseline's apart), a variant resolved worse says so, a
label or stars on an unresolved Δ read tentative in themselves, data that lean neither way are *inconclusive*
rather than *suggestive* (checked on null worlds), and the Interpretation and the Variants section say only
what is true. In process: imported CSVs through ``cli_here``, or the pure functions on synthetic tables."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd
import pytest
from helpers import cli_here
from scipy import stats
from statsmodels.stats.multitest import multipletests

from attnres.reports import comparisons, evidence
from attnres.reports.bench import evidence_rows, resolved_against_baseline, verdicts
from attnres.reports.tables import per_variant
from attnres.reports.verdicts import TENTATIVE
from attnres.tracking import states
from attnres.tracking.run_store import RunStore
from attnres.variants.registry import resolve_run

LABELS = ("Best quality/cost ratio", "Best quality", "Solid", "Modest", "Not worth it", "Worse")
_count = itertools.count()


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNRES_DB", str(tmp_path / "runs.db"))
    return tmp_path


def world(values: dict[str, dict[int, float]], tps: dict[str, float] | None = None) -> pd.DataFrame:
    """Import rows: each run finished at step 100 with the given eval loss (0.5 higher at step 50), its
    throughput and memory logged."""
    out = []
    for i, (variant, seeds) in enumerate(values.items()):
        for seed, value in seeds.items():
            base = {"variant": variant, "seed": seed, "status": "finished", "preset": "tiny", "experiment": "labels",
                    "total_steps": 100}
            out += [{**base, "step": 50, "key": "eval_loss", "value": value + 0.5},
                    {**base, "step": 100, "key": "eval_loss", "value": value},
                    {**base, "step": 100, "key": "tokens_per_s", "value": (tps or {}).get(variant, 1000.0 - 50 * i)},
                    {**base, "step": 100, "key": "peak_memory_bytes", "value": 1e9 * (1 + i / 10)}]
    return pd.DataFrame(out)


def report(values: dict[str, dict[int, float]], tps: dict[str, float] | None = None) -> str:
    """The written document of an imported world (a fresh database each call)."""
    n = next(_count)
    world(values, tps).to_csv(f"w{n}.csv", index=False)
    cli_here("import", f"w{n}.csv", "--db", f"w{n}.db", check=True)
    cli_here("report", "--out", f"w{n}.md", "--no-plots", "--db", f"w{n}.db", check=True)
    RunStore.forget_all()
    return open(f"w{n}.md").read()


def quality(text: str) -> dict[str, str]:
    """The Cost/Benefit table's Quality cell per variant."""
    section = text.split("## Cost/Benefit Summary", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in section.splitlines()[4:]
            if ln.startswith("| ")]
    return {r[0]: r[1] for r in rows}


def p_of(a: dict[int, float], b: dict[int, float]) -> float:
    """scipy's p for the document's test: paired over the same seeds, else Welch's."""
    if set(a) == set(b):
        return stats.ttest_rel([a[s] for s in sorted(a)], [b[s] for s in sorted(a)]).pvalue
    return stats.ttest_ind(list(a.values()), list(b.values()), equal_var=False).pvalue


def holm(values: dict[str, dict[int, float]], pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Holm over one family at look 1 (each p doubled), as the document adjusts it."""
    adjusted = multipletests([min(1.0, 2 * p_of(values[a], values[b])) for a, b in pairs], method="holm")[1]
    return dict(zip(pairs, adjusted, strict=True))


def shifted(base: dict[int, float], by: float, noise: list[float]) -> dict[int, float]:
    return {s: v + by + e for (s, v), e in zip(base.items(), noise, strict=True)}


BASE = {1: 3.000, 2: 3.010, 3: 2.990, 4: 3.005}


# -- 1. the clause after a label is the evidence for that label ---------------------------------------------
def test_best_quality_cites_first_against_second_and_the_baseline_apart(here):
    """Both variants resolved ahead of the baseline, the first not resolved ahead of the second: the seed's
    "Best quality — resolved" would have quoted the baseline's test. It reads tentative, cites the top-two test
    after the dash, and states the baseline's test after "vs baseline"."""
    values = {"standard": BASE, "control_block": shifted(BASE, -0.050, [0.001, -0.002, 0.002, -0.001]),
              "block_hybrid_memory": shifted(BASE, -0.048, [-0.001, 0.001, -0.002, 0.002])}
    text = report(values)
    first, second = "control_block", "block_hybrid_memory"
    adj = holm(values, [(first, "standard"), (second, "standard"), (first, second)])
    assert adj[(first, "standard")] < 0.05 < adj[(first, second)]
    v = verdicts(text)[first]
    label, clause = v.split(" — ", 1)
    assert label.startswith("Best quality (tentative)")
    assert clause.startswith(f"vs {second}, second: unresolved: ~")  # the top-two test, not the baseline's
    assert f"; vs baseline: resolved (Holm-adjusted p = {adj[(first, 'standard')]:.3g})" in clause
    row = next(r for r in evidence_rows(text) if r["Comparison"] == f"{first} vs {second}")
    assert row["Kind"] == "top two" and row["Holm-adjusted p"] == f"{adj[(first, second)]:.3g}"
    assert clause.startswith(f"vs {second}, second: {row['Evidence']}")
    # its Δ against the baseline is resolved: its stars are not tentative, and the second's label is not either
    assert TENTATIVE not in quality(text)[first] and not verdicts(text)[second].split(" — ")[0].endswith(TENTATIVE)
    assert resolved_against_baseline(v)  # (`attnres bench errors` still counts it)


def test_best_quality_resolved_ahead_of_both_is_not_tentative(here):
    values = {"standard": BASE, "control_block": shifted(BASE, -0.080, [0.001, -0.001, 0.0005, -0.0005]),
              "block_hybrid_memory": shifted(BASE, -0.040, [-0.001, 0.001, -0.0005, 0.0005])}
    text = report(values)
    pairs = [("control_block", "standard"), ("block_hybrid_memory", "standard"),
             ("control_block", "block_hybrid_memory")]
    adj = holm(values, pairs)
    assert max(adj.values()) < 0.05
    v = verdicts(text)["control_block"]
    assert re.match(r"Best quality(; Best quality/cost ratio)?(, \w+)? — "
                    r"vs block_hybrid_memory, second: resolved \(Holm-adjusted p = "
                    + re.escape(f"{adj[pairs[2]]:.3g}") + r"\); vs baseline: resolved \(Holm-adjusted p = "
                    + re.escape(f"{adj[pairs[0]]:.3g}") + r"\)$", v), v
    assert quality(text)["control_block"] == "★★★★★ (-0.080)"  # resolved: the seed's own form


def test_one_variant_has_no_second(here):
    values = {"standard": BASE, "control_block": shifted(BASE, -0.030, [0.001, -0.001, 0.0005, -0.0005])}
    v = verdicts(report(values))["control_block"]
    assert v.startswith("Best quality") and " — the only variant compared; vs baseline: resolved (" in v
    assert TENTATIVE not in v.split(" — ")[0]


# -- 2. a variant resolved worse says it is worse --------------------------------------------------------
def test_resolved_worse_says_worse_and_an_unresolved_rise_is_not_worth_it(here):
    values = {"standard": BASE, "control_block": shifted(BASE, -0.010, [0.001, -0.001, 0.0005, -0.0005]),
              "block_value_proj": shifted(BASE, +0.040, [0.001, -0.001, 0.0005, -0.0005]),
              "block_alibi_depth": shifted(BASE, +0.002, [0.010, -0.012, 0.008, -0.006])}
    text = report(values)
    pairs = [("control_block", "standard"), ("block_alibi_depth", "standard"), ("block_value_proj", "standard"),
             ("control_block", "block_alibi_depth")]
    adj = holm(values, pairs)
    v = verdicts(text)
    assert v["block_value_proj"] == f"Worse — resolved (Holm-adjusted p = {adj[pairs[2]]:.3g})"
    assert quality(text)["block_value_proj"] == "☆ (+0.040)"
    assert adj[pairs[1]] > 0.05 and v["block_alibi_depth"].startswith("Not worth it (tentative) — unresolved: ~")


# -- 3. labels and stars on unresolved Δs read tentative in themselves ---------------------------------------
def test_the_issues_cases_read_tentative(here):
    """'★★★★★ (-0.094) … Best quality; Best quality/cost ratio — unresolved' at a Holm-adjusted p of 1, and
    'Best quality' on 1 seed against 2."""
    noisy = {"standard": {1: 3.0, 2: 3.2, 3: 2.8}, "control_block": {1: 2.806, 2: 3.006, 3: 2.906}}
    text = report(noisy)
    v = verdicts(text)["control_block"]
    label = v.split(" — ")[0]
    assert label.startswith("Best quality (tentative)") and " — the only variant compared; vs baseline: unresolved" in v
    assert all(tentative for _, tentative in _label_words(label))  # (and its cost ratio, where it earns one)
    assert quality(text)["control_block"] == "★★★★★ (tentative) (-0.094)"
    lucky = {"standard": {1: 3.00, 2: 3.01}, "control_block": {1: 2.90}, "block_hybrid_memory": {1: 2.96, 2: 2.97}}
    text = report(lucky)
    v = verdicts(text)["control_block"]
    assert v.startswith("Best quality (tentative)") and " — vs block_hybrid_memory, second: untested (1 vs 2 " in v
    assert quality(text)["control_block"].endswith(f"{TENTATIVE} (-0.105)")


def _label_words(label: str) -> list[tuple[str, bool]]:
    """(label word, tentative) for each word of a verdict's label part (before the dash)."""
    out = []
    for part in label.split("; "):
        word = next(w for w in LABELS if part.startswith(w))
        out.append((word, part[len(word):].startswith(TENTATIVE)))
    return out


def test_every_label_says_no_more_than_its_tests(here):
    """Random worlds (true effects, zero or not; 1-4 seeds per arm, shared or not): each verdict's words, its
    tentative marks and its stars agree with the Statistical Evidence table's own rows."""
    rng = np.random.default_rng(45)
    names = ["control_block", "block_hybrid_memory", "block_alibi_depth", "block_value_proj"]
    seen = {"tentative": 0, "earned": 0, "worse": 0}
    for _ in range(10):
        values = {"standard": {s: 3.0 + rng.normal(0, 0.01) for s in range(1, int(rng.integers(1, 5)) + 1)}}
        for name in names[: int(rng.integers(2, 5))]:
            effect = float(rng.choice([0.0, -0.03, -0.015, 0.03, -0.08]))
            seeds = range(1, int(rng.integers(1, 5)) + 1) if rng.random() < 0.6 else range(11, 14)
            values[name] = {s: 3.0 + effect + rng.normal(0, 0.01) for s in seeds}
        text = report(values)
        rows = {r["Comparison"]: r for r in evidence_rows(text)}
        top = next((r for r in rows.values() if r["Kind"] == "top two"), None)
        stars = quality(text)
        for name, verdict in verdicts(text).items():
            base = rows[f"{name} vs standard"]
            resolved = base["Evidence"].startswith("resolved")
            delta = float(base["Δ"])
            label, clause = verdict.split(" — ", 1)
            if resolved and delta > 0:
                assert verdict.startswith("Worse — resolved"), verdict
                seen["worse"] += 1
                continue
            words = _label_words(label)
            for word, tentative in words:
                if word == "Best quality":
                    ahead = top is not None and top["Comparison"].startswith(f"{name} vs ")
                    earned = resolved and (top is None or (ahead and top["Evidence"].startswith("resolved")))
                    if ahead:
                        second = top["Comparison"].split(" vs ")[1]
                        assert clause.startswith(f"vs {second}, second: {top['Evidence']}"), verdict
                    assert clause.endswith(f"; vs baseline: {base['Evidence']}"), verdict
                elif word == "Worse":
                    earned = True
                elif word == "Not worth it":
                    earned = resolved
                else:
                    earned = resolved
                    assert "Best quality" in dict(words) or clause == base["Evidence"], verdict
                assert tentative == (not earned), verdict
                seen["tentative" if tentative else "earned"] += 1
            assert stars[name].endswith(f"{TENTATIVE} ({base['Δ']})") == (delta < 0 and not resolved), stars[name]
    assert min(seen.values()) > 0, seen  # the worlds reached each case


# -- 4. suggestive or inconclusive: a stated rule, bounded on null worlds --------------------------------------
def _pair(a: dict[int, float], b: dict[int, float]) -> evidence.Comparison:
    """One comparison against the baseline, tested and decided as a document's (one stage, its last step)."""
    ids = {(arm, s): i for i, (arm, s) in enumerate(((arm, s) for arm, x in enumerate((a, b)) for s in x), 1)}
    runs = pd.DataFrame([{"id": i, "variant": ("control_block", "standard")[arm], "seed": s, "status": "finished",
                          "launch_id": 1} for (arm, s), i in ids.items()])
    rows = [pd.Series({"values": x, "run_ids": {s: ids[(arm, s)] for s in x}}) for arm, x in enumerate((a, b))]
    c = evidence.assess(evidence.Comparison("control_block", "standard", evidence.BASELINE, 100), *rows, runs)
    return evidence.control([c])[0]


def test_suggestive_only_where_the_data_lean_and_rarely_when_nothing_differs():
    """No true difference, 3 seeds per arm, paired or Welch: a comparison is suggestive exactly when its own
    p is below LEAN (its 90% interval excludes 0), inconclusive otherwise, so the share suggestive stays at
    LEAN (within the binomial spread of the draws); the rest are inconclusive, none resolved."""
    rng = np.random.default_rng(2045)
    n, counts = 300, {evidence.SUGGESTIVE: 0, evidence.INCONCLUSIVE: 0}
    for i in range(n):
        a = dict(zip((1, 2, 3), 3.0 + rng.normal(0, 0.01, 3), strict=True))
        seeds = (1, 2, 3) if i % 2 else (4, 5, 6)
        b = dict(zip(seeds, 3.0 + rng.normal(0, 0.01, 3), strict=True))
        c = _pair(a, b)
        cls = evidence.evidence_class(c)
        if c.resolved:
            continue
        assert cls == (evidence.SUGGESTIVE if p_of(a, b) < evidence.LEAN else evidence.INCONCLUSIVE)
        counts[cls] += 1
    assert counts[evidence.SUGGESTIVE] <= stats.binom.ppf(0.999, n, evidence.LEAN), counts
    assert counts[evidence.INCONCLUSIVE] >= n * 0.8, counts
    # the rule is the method text's and the Interpretation's
    assert "*inconclusive* (p ≥ 0.10" in evidence.METHOD and "below 0.10" in evidence.METHOD


def test_null_family_worlds_are_mostly_inconclusive():
    """The bench's null design (`attnres bench errors`): a baseline and nine variants from one distribution, 3
    seeds each. Over the comparisons that are not chosen by rank (against the baseline, the contrasts), the share
    called suggestive stays near LEAN; the data lean neither way in the rest."""
    from attnres.reports.bench import _arms

    base, names = _arms()
    rng = np.random.default_rng(7)
    classes = []
    for _ in range(20):
        values = {v: dict(zip((1, 2, 3), 3.0 + rng.normal(0, 0.01, 3), strict=True)) for v in [base, *names[:9]]}
        runs = pd.DataFrame([{"id": i, "variant": v, "seed": s, "status": "finished", "step": 100,
                              "total_steps": 100, "stop_step": None, "final_train_loss": x, "tokens_per_s": 1.0,
                              "peak_memory_bytes": 1.0, "launch_id": 1}
                             for i, (v, s, x) in enumerate(((v, s, x) for v, xs in values.items()
                                                            for s, x in xs.items()), 1)])
        evals = pd.DataFrame({"run_id": runs["id"], "step": 100, "value": runs["final_train_loss"]})
        found = comparisons.document(runs, evals, base, 100,
                                     comparisons.Group(per_variant(runs, evals, 100), 100, False))
        classes += [evidence.evidence_class(c) for c in found if c.kind != evidence.TOP_TWO and c.testable]
    share = classes.count(evidence.SUGGESTIVE) / len(classes)
    assert len(classes) > 250 and share <= 0.15, share  # (rule: 0.10 per comparison; shared arms correlate them)
    assert classes.count(evidence.INCONCLUSIVE) / len(classes) >= 0.8


def test_the_interpretation_claims_no_direction_for_inconclusive_data(here):
    values = {"standard": BASE, "control_block": shifted(BASE, -0.040, [0.001, -0.001, 0.0005, -0.0005]),
              "block_hybrid_memory": shifted(BASE, -0.040, [0.012, -0.009, 0.006, -0.005]),
              "block_gqa_depth": shifted(BASE, -0.080, [0.001, -0.001, 0.0005, -0.0005])}  # first: not the pair
    text = report(values)
    body = text.split("## Interpretation", 1)[1].split("\n## ", 1)[0]
    line = next(ln for ln in body.splitlines() if ln.startswith("- block_hybrid_memory against control_block"))
    assert p_of(values["block_hybrid_memory"], values["control_block"]) >= evidence.LEAN
    assert "shows no lean either way in eval loss (unresolved)" in line and line.endswith("— **inconclusive**")
    assert "**inconclusive** (unresolved, and the data lean neither way" in body


# -- 5. odd phrasings --------------------------------------------------------------------------------------
def test_one_depth_attention_variant_is_not_the_closest_or_the_furthest(here):
    for by, ahead in ((-0.030, "is ahead"), (+0.030, "is not ahead")):
        text = report({"standard": BASE, "control_block": shifted(BASE, by, [0.001, -0.001, 0.0005, -0.0005])})
        body = text.split("## Interpretation", 1)[1].split("\n## ", 1)[0]
        assert f"- The one depth-attention variant, control_block, {ahead} of standard at step 100: Δ " in body
        assert "the closest is" not in body and "the furthest ahead is" not in body


def _trained_here(store: RunStore, variant: str, seed: int, value: float) -> None:
    """A run recorded by this attnres (its config holds its model), finished at step 100."""
    cfg = resolve_run(variant, "tiny", seed, ["steps=100"], experiment="labels")
    run_id = store.create_run(cfg, status=states.FINISHED, actor=states.IMPORTER)
    store.update_run(run_id, step=100)
    store.log_metrics(run_id, [(50, "eval_loss", value + 0.5), (100, "eval_loss", value),
                               (100, "tokens_per_s", 1000.0), (100, "peak_memory_bytes", 1e9)])


def test_parameters_say_where_their_counts_come_from(here):
    store = RunStore(str(here / "here.db"))
    for seed, value in BASE.items():
        _trained_here(store, "standard", seed, value)
        _trained_here(store, "control_block", seed, value - 0.02)
    cli_here("report", "--out", "here.md", "--no-plots", "--db", "here.db", check=True)
    text = open("here.md").read()
    assert "\nParameters: as trained; the output layer" in text and "recorded elsewhere" not in text
    imported = report({"standard": BASE, "control_block": shifted(BASE, -0.02, [0, 0, 0, 0.001])})
    assert "\nParameters: the variant's model at preset tiny (the runs were recorded elsewhere, without their " \
           "model);" in imported
