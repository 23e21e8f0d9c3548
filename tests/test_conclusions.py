"""The document concludes and plans: verdicts that keep their ranking with their evidence, family-wise and
sequential error control, an Interpretation generated from traits, What's Next as a plan, `attnres next`."""

from __future__ import annotations

import ast
import math
import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import BYTES, FAST_GPT2, INLINE, ROOT, cli_here
from scipy import stats
from seed_scenario import rows as seed_rows
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from attnres.reports import comparisons, evidence
from attnres.reports.bench import evidence_rows, verdicts
from attnres.reports.build import write_report
from attnres.reports.power import pairs_needed, seeds_needed, t_power
from attnres.reports.stats import seed_plan
from attnres.reports.tables import per_variant
from attnres.tracking import records, states
from attnres.tracking.run_store import RunStore
from attnres.variants import traits
from attnres.variants.registry import VARIANTS, resolve_run

NINE = [v for v in VARIANTS if v != "standard" and VARIANTS[v].depth_mult == 1][:9]


def frames(values: dict[str, dict[int, float]], stage: dict[tuple[str, int], int] | None = None
           ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run table and an evals table at step 100 (every run finished), each run in its stage."""
    runs, evals = [], []
    for variant, seeds in values.items():
        for seed, value in seeds.items():
            rid = len(runs) + 1
            runs.append({"id": rid, "variant": variant, "seed": seed, "status": "finished", "step": 100,
                         "total_steps": 100, "stop_step": None, "final_train_loss": value, "tokens_per_s": 1000.0,
                         "peak_memory_bytes": 1e9, "launch_id": (stage or {}).get((variant, seed), 1)})
            evals.append({"run_id": rid, "step": 100, "value": value})
    return pd.DataFrame(runs), pd.DataFrame(evals)


def exact_p(a: dict[int, float], b: dict[int, float]) -> float:
    """scipy's p-value for the test the document makes: paired over the same seeds, Welch's otherwise."""
    if len(a) >= 2 and set(a) == set(b):
        return stats.ttest_rel([a[s] for s in sorted(a)], [b[s] for s in sorted(a)]).pvalue
    return stats.ttest_ind(list(a.values()), list(b.values()), equal_var=False).pvalue


def assessed(values: dict[str, dict[int, float]], stage: dict[tuple[str, int], int] | None = None
           ) -> list[evidence.Comparison]:
    runs, evals = frames(values, stage)
    return comparisons.document(runs, evals, "standard", 100,
                                comparisons.Group(per_variant(runs, evals, 100), 100, False))


def test_family_wise_error_stays_under_alpha_when_nothing_differs():
    """Nine variants and the baseline from one distribution, 3 seeds each: Holm over the primary family (and,
    apart, over the contrasts) keeps the rate of any 'resolved' under 5%; plain p < 0.05 does not."""
    rng = np.random.default_rng(2026)
    draws, primary, anywhere, plain = 100, 0, 0, 0
    for _ in range(draws):
        values = {v: dict(zip((1, 2, 3), 3.0 + rng.normal(0, 0.01, 3), strict=True)) for v in ["standard", *NINE]}
        found = assessed(values)
        primary += any(c.resolved for c in found if c.family == evidence.PRIMARY)
        anywhere += any(c.resolved for c in found)
        plain += any(stats.ttest_ind(list(values[v].values()), list(values["standard"].values()),
                                     equal_var=False).pvalue < 0.05 for v in NINE)
    assert primary / draws <= 0.05 and anywhere / draws <= 0.05, (primary, anywhere)
    assert plain / draws > 0.1  # the same draws, uncorrected: the error the correction removes


def test_adding_seeds_until_p_is_small_never_resolves_more_than_alpha():
    """One more seed per arm per stage, up to 8 looks, stopping at the first 'resolved', no true difference."""
    rng = np.random.default_rng(7)
    draws, hits, plain = 150, 0, 0
    for _ in range(draws):
        base, var = 3.0 + rng.normal(0, 0.01, 9), 3.0 + rng.normal(0, 0.01, 9)
        plain += any(stats.ttest_ind(var[: k + 2], base[: k + 2], equal_var=False).pvalue < 0.05 for k in range(8))
        runs = pd.DataFrame([{"id": i * 2 + arm + 1, "variant": v, "seed": i + 1, "status": "finished",
                              "launch_id": max(1, i)} for i in range(9)
                             for arm, v in enumerate(("control_block", "standard"))])
        for k in range(8):
            n = k + 2  # stage 1 holds seeds 1-2, stage j > 1 adds seed j + 1
            arms = [pd.Series({"values": dict(enumerate(x[:n], 1)), "run_ids": {i + 1: i * 2 + arm + 1
                                                                                for i in range(n)}})
                    for arm, x in enumerate((var, base))]
            c = evidence.assess(evidence.Comparison("control_block", "standard", evidence.BASELINE, 100),
                                *arms, runs[runs["seed"] <= n])
            evidence.control([c])
            assert c.look == k + 1
            if c.resolved:
                hits += 1
                break
    assert hits / draws <= 0.05, hits
    assert plain / draws > 0.1, plain


def test_a_stage_still_going_holds_its_test_and_the_earlier_look_stands():
    """Stage 2 added seed 3 (finished) and seed 4 (preempted: it resumes later): the test stays on stage 1's
    seeds, at look 1, and says what it waits for; seed 3 is not tested before its stage is complete."""
    values = {"standard": {1: 3.00, 2: 3.02, 3: 3.01}, "control_block": {1: 2.90, 2: 2.93, 3: 2.91}}
    runs, evals = frames(values, {(v, s): 1 if s < 3 else 2 for v in values for s in (1, 2, 3)})
    late = {"id": 7, "variant": "control_block", "seed": 4, "status": "preempted", "step": 50, "total_steps": 100,
            "stop_step": None, "final_train_loss": None, "tokens_per_s": 1000.0, "peak_memory_bytes": 1e9,
            "launch_id": 2}
    runs = pd.concat([runs, pd.DataFrame([late])], ignore_index=True)
    c = comparisons.document(runs, evals, "standard", 100,
                             comparisons.Group(per_variant(runs, evals, 100), 100, False))[0]
    p = exact_p({1: 2.90, 2: 2.93}, {1: 3.00, 2: 3.02})  # the same seeds: paired
    assert (c.a, c.seeds(), c.look, c.waiting) == ("control_block", "2 vs 2", 1, [("control_block", 4, 50)])
    assert c.p == pytest.approx(p) and c.p_adj == pytest.approx(min(1.0, 2 * p))
    assert evidence.evidence_text(c).endswith("waits for control_block s4 (step 50)")


def test_no_decision_before_the_last_step_and_none_without_spread():
    """A difference seen at step 60 of 100, runs still going, is interim (each eval step would be one more look);
    arms without any spread are untested (the p-value would be 0 for any difference)."""
    values = {"standard": {1: 3.00, 2: 3.01, 3: 3.02}, "control_block": {1: 2.80, 2: 2.82, 3: 2.81}}
    runs, evals = frames(values)
    runs["status"], runs["step"] = "running", 60
    evals["step"] = 60
    c = comparisons.document(runs, evals, "standard", 100,
                             comparisons.Group(per_variant(runs, evals, 60), 60, True))[0]
    assert c.interim and c.p < 0.001 and not c.resolved and math.isnan(c.p_adj)
    assert evidence.evidence_text(c).startswith("interim at step 60, no decision before the last step")
    assert evidence.evidence_class(c) == evidence.SUGGESTIVE
    final = assessed(values)[0]
    assert final.resolved and not final.interim  # the same seeds at the last step decide
    flat = assessed({"standard": {1: 3.0, 2: 3.0}, "control_block": {3: 2.999, 4: 2.999}})[0]  # Welch
    assert not flat.testable and not flat.resolved and "no spread within either arm" in evidence.evidence_text(flat)
    same = assessed({"standard": {1: 3.0, 2: 3.1}, "control_block": {1: 2.9, 2: 3.0}})[0]  # paired: Δ -0.1 twice
    assert not same.testable and "the paired differences do not vary" in evidence.evidence_text(same)


def test_a_run_resumed_after_it_ended_joins_a_new_stage(workdir):
    """Its seed arrives after its stage was complete (and maybe tested without it): one more look."""
    from attnres.runs import orchestrator

    store = RunStore(str(workdir / "runs.db"))
    first = store.new_launch(records.LAUNCH)
    cfg = resolve_run("standard", "tiny", 1, _settings(), "builtin-bytes")
    ended = store.create_run(cfg, status=states.FAILED, actor=states.IMPORTER, launch_id=first)
    cut = store.create_run(resolve_run("standard", "tiny", 2, _settings(), "builtin-bytes"),
                           status=states.PREEMPTED, actor=states.IMPORTER, launch_id=first)
    orchestrator.reopen(store, [ended, cut])
    frame = store.launches_frame()
    assert store.run(ended).launch_id == frame["id"].max() > first
    assert list(frame["origin"]) == ["launch", "resume"]
    assert store.run(cut).launch_id == first  # a preempted run's stage waited for it


@pytest.mark.integration
def test_sequential_looks_through_import_and_report(workdir):
    """The same seeds give 'resolved' when launched at once and 'unresolved' when added stage by stage
    until p < 0.05: the report counts the looks (one per imported stage) and spends α/2^k at look k."""
    base = {1: 3.000, 2: 3.010, 3: 3.004, 4: 2.998, 5: 3.006}
    var = {s: base[s] + d for s, d in zip(base, (-0.008, -0.004, -0.010, -0.002, -0.006), strict=True)}
    p = exact_p(var, base)  # the same seeds: paired
    assert 0.05 / 8 < p < 0.05 / 2  # resolved at look 1, not at look 3

    def rows(seeds: list[int], stage: str) -> pd.DataFrame:
        return pd.DataFrame([{"variant": v, "seed": s, "step": 100, "key": "eval_loss", "value": x[s],
                              "preset": "tiny", "total_steps": 100, "launch": stage}
                             for v, x in (("standard", base), ("control_block", var)) for s in seeds])

    at_once = RunStore(str(workdir / "once.db"))
    rows([1, 2, 3, 4, 5], "a").to_csv(workdir / "once.csv", index=False)
    at_once.import_file(workdir / "once.csv")
    row = evidence_rows(write_report(at_once, workdir / "once.md", plots=False))[0]
    assert row["Look"] == "1" and row["Holm-adjusted p"] == f"{2 * p:.3g}" and row["Evidence"].startswith("resolved")

    staged = RunStore(str(workdir / "staged.db"))
    # three launches, three looks, in one file: stages follow their launch values (9 before 10)
    pd.concat([rows([1, 2, 3], "2"), rows([4], "9"), rows([5], "10")]).to_csv(workdir / "staged.csv", index=False)
    staged.import_file(workdir / "staged.csv")
    text = write_report(staged, workdir / "staged.md", plots=False)
    row = evidence_rows(text)[0]
    assert row["p"] == f"{p:.3g}" and row["Look"] == "3" and row["Holm-adjusted p"] == f"{8 * p:.3g}"
    assert row["Test"] == "paired (5 pairs)"
    assert row["Evidence"].startswith("unresolved: ~") and row["Evidence"].endswith("; look 3")
    assert "; vs baseline: unresolved: ~" in verdicts(text)["control_block"]  # (Best quality: the only variant)
    # an export keeps the stages: imported elsewhere, the report counts the same looks
    cli_here("export", "--db", str(workdir / "staged.db"), "--out", "exp", check=True)
    cli_here("import", str(workdir / "exp" / "metrics.csv"), "--db", str(workdir / "again.db"), check=True)
    again = write_report(RunStore(str(workdir / "again.db")), workdir / "again.md", plots=False)
    assert evidence_rows(again)[0]["Look"] == "3"


def interpretation_scenario() -> tuple[pd.DataFrame, dict[str, dict[int, float]]]:
    finals = {
        "standard": {1: 3.000, 2: 3.004, 3: 2.996},
        "control_block": {1: 2.950, 2: 2.956, 3: 2.946},
        "block_hybrid_memory": {1: 2.900, 2: 2.907, 3: 2.897},  # the window: resolved lower
        "block_value_proj": {1: 3.100, 2: 3.103, 3: 3.097},  # expected to help, resolved worse: contradicted
        "block_alibi_depth": {1: 2.940, 2: 2.960, 3: 2.945},  # lower, unresolved, p ~ 0.6: inconclusive
        "block_input_dep_query": {1: 2.952},  # one seed: not yet testable
        "block_gqa_depth": {1: 2.951, 2: 2.955, 3: 2.947},  # query sharing alone: a clean ablation
    }
    out = []
    for variant, seeds in finals.items():
        for seed, value in seeds.items():
            out += [{"variant": variant, "seed": seed, "step": s, "key": "eval_loss", "value": v, "preset": "tiny",
                     "total_steps": 100} for s, v in ((50, value + 0.3), (100, value))]
    out.append({"variant": "block_rope_depth", "seed": 1, "step": 20, "key": "train_loss", "value": 9.0,
                "preset": "tiny", "total_steps": 100, "status": "failed", "message": "RuntimeError: NaN loss"})
    for variant, value in (("deep_baseline", 3.35), ("deep_control_block", 3.25)):
        out.append({"variant": variant, "seed": 1, "step": 50, "key": "eval_loss", "value": value, "preset": "tiny",
                    "total_steps": 100, "status": "running"})
    return pd.DataFrame(out), finals


def sentences(text: str) -> list[tuple[str, str]]:
    body = text.split("## Interpretation", 1)[1].split("\n## ", 1)[0]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^- (.*) — \*\*(.+)\*\*$", body, re.MULTILINE)]


@pytest.mark.integration
def test_interpretation_findings_come_from_traits_with_their_numbers_and_evidence_class(workdir):
    frame, finals = interpretation_scenario()
    frame.to_csv(workdir / "s.csv", index=False)
    cli_here("import", "s.csv", check=True)
    text = write_report(RunStore(str(workdir / "runs.db")), workdir / "r.md", plots=False)
    said = sentences(text)

    def about(a: str, b: str) -> tuple[str, str]:
        return next(s for s in said if s[0].startswith(f"{a} against {b}"))

    classes = {a: about(a, "control_block")[1] for a in ("block_hybrid_memory", "block_value_proj",
                                                         "block_alibi_depth", "block_input_dep_query")}
    assert classes == {"block_hybrid_memory": "resolved", "block_value_proj": "contradicted",
                       "block_alibi_depth": "inconclusive", "block_input_dep_query": "not yet testable"}
    assert "lowers eval loss" in about("block_hybrid_memory", "control_block")[0]
    assert "raises eval loss" in about("block_value_proj", "control_block")[0]
    assert "shows no lean either way in eval loss (unresolved)" in about("block_alibi_depth", "control_block")[0]
    assert "its query sharing (one query per group of 4 layers)" in about("block_gqa_depth", "control_block")[0]
    # a finding with no data is left out: no variant here has per-layer sources
    assert "### " in text and "Source granularity" not in text
    # runs that ended early: step and cause; the deep comparison with its partial step
    assert any("block_rope_depth s1 failed at step 20 of 100 (RuntimeError: NaN loss)" in s for s, _ in said)
    assert any(s.startswith("At step 50 (partial), eval loss orders deep_control_block 3.250 < standard "
                            f"{np.mean([x + 0.3 for x in finals['standard'].values()]):.3f} < deep_baseline 3.350")
               for s, _ in said)
    # every tested number is scipy's and statsmodels': the p of each pair's test, Holm per family at look 1 (p x 2)
    rows = evidence_rows(text)
    for family in (evidence.PRIMARY, evidence.SECONDARY):
        mine = [r for r in rows if r["p"] != "—" and (r["Kind"].startswith("contrast")) ==
                (family == evidence.SECONDARY)]
        exact = []
        for r in mine:
            a, b = r["Comparison"].split(" vs ")
            exact.append(exact_p(finals[a], finals[b]))
            assert r["p"] == f"{exact[-1]:.3g}", r
            assert r["Δ"] == f"{np.mean(list(finals[a].values())) - np.mean(list(finals[b].values())):+.3f}"
        adjusted = multipletests([min(1.0, 2 * q) for q in exact], method="holm")[1]
        assert [r["Holm-adjusted p"] for r in mine] == [f"{q:.3g}" for q in adjusted]
    # and the sentence quotes the Evidence table's own figures
    hybrid = next(r for r in rows if r["Comparison"] == "block_hybrid_memory vs control_block")
    assert f"Δ {hybrid['Δ']} at step 100 (3 vs 3 seeds); {hybrid['Evidence']}" in about(
        "block_hybrid_memory", "control_block")[0]


@pytest.mark.integration
def test_interpretation_and_whats_next_quote_the_tables(workdir):
    """On the seed document's own situation: every decimal and every seed count the generated sections give
    appears in the document's tables (a retry's proposed learning rates are settings, not figures)."""
    seed_rows().to_csv(workdir / "seed.csv", index=False)
    cli_here("import", "seed.csv", check=True)
    text = write_report(RunStore(str(workdir / "runs.db")), workdir / "r.md", plots=False)
    generated = text.split("## Interpretation", 1)[1]
    generated = generated.split("## Cost/Benefit Summary")[0] + generated.split("## What's Next")[1]
    tables = "\n".join(ln for ln in text.splitlines() if ln.startswith("|"))
    generated = "\n".join(ln for ln in generated.splitlines() if "learning rate" not in ln and "lr=" not in ln)
    numbers = set(re.findall(r"[-+]?\d+\.\d+|~\d+", generated))
    assert len(numbers) > 20
    assert [n for n in numbers if n not in tables] == []
    for section in ("## Interpretation", "## What's Next", "## Statistical Evidence"):
        assert section in text


def test_no_rule_names_a_variant():
    """Verdicts, comparisons, findings and the plan reason over traits: no registry name in their code."""
    for path in ["reports/verdicts.py", "reports/comparisons.py", "reports/findings.py", "reports/next_plan.py",
                 "reports/evidence.py", "reports/analysis.py", "attnres/variants/traits.py"]:
        tree = ast.parse((ROOT / path).read_text())
        docs = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and node.body
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and id(n) not in docs}
        named = [(s, v) for s in strings for v in VARIANTS if re.search(rf"\b{v}\b", s)]
        assert named == [], (path, named)


def test_power_is_finite_and_seed_counts_grow_with_the_spread():
    # scipy's noncentral t returns NaN in some far tails: the power of a large effect must still be ~1
    assert t_power(3, 6.67, 0.0125) == pytest.approx(0.98524, abs=1e-4)
    assert t_power(3, 20.0, 0.0125) == pytest.approx(1.0)
    needs = [seeds_needed(-0.1, s, s, alpha=0.0125) for s in (0.005, 0.01, 0.02, 0.03, 0.05, 0.08)]
    assert needs == sorted(needs) and needs[0] == 2


def test_paired_seed_counts_are_statsmodels_paired_power_and_carry_their_uncertainty():
    """Arms that share seeds are planned for the paired test: the count is the smallest n whose power under
    statsmodels' TTestPower (σ of the differences at its 90% upper confidence bound) reaches 0.8, and is
    also given at σ as observed;
    arms without shared seeds are planned for Welch's (two-sample power)."""
    from statsmodels.stats.power import TTestIndPower

    rng = np.random.default_rng(3)
    checked, more = 0, []
    for _ in range(40):
        seeds = list(range(1, int(rng.integers(2, 6)) + 1))
        shift = float(rng.uniform(-0.05, -0.005))
        common = rng.normal(3.0, 0.05, len(seeds))  # a seed's data order moves both arms alike
        a = {s: float(c + shift + rng.normal(0, 0.01)) for s, c in zip(seeds, common, strict=True)}
        b = {s: float(c + rng.normal(0, 0.01)) for s, c in zip(seeds, common, strict=True)}
        plan = seed_plan(a, b, float(np.mean(list(a.values())) - np.mean(list(b.values()))), 0.01)
        diffs = np.array([a[s] - b[s] for s in seeds])
        high = diffs.std(ddof=1) * math.sqrt((len(seeds) - 1) / stats.chi2.ppf(0.1, len(seeds) - 1))
        effect = abs(diffs.mean()) / high
        n = plan["need"]
        assert plan["design"] == "paired" and plan["observed"] <= n
        # statsmodels' power at the count and one below it (the count is the smallest that reaches 0.8)
        powers = {k: TTestPower().power(effect, k, 0.01) for k in (n - 1, n) if 2 <= k < 2000}
        if math.isfinite(powers.get(n, math.nan)) and (n == 2 or math.isfinite(powers[n - 1])):
            assert powers[n] >= 0.8 and (n == 2 or powers[n - 1] < 0.8), (n, powers[n], powers.get(n - 1))
            checked += 1
        # unpaired, the seeds' shared movement is spread: it asks for more seeds (on most draws: few seeds)
        welch = seed_plan(a, {s + 100: v for s, v in b.items()}, float(diffs.mean()), 0.01)
        assert welch["design"] == "Welch"
        more.append(welch["need"] > n)
    assert checked >= 30 and sum(more) > 0.75 * len(more)
    # Welch's count is statsmodels' two-sample power at the pooled spread's upper bound (4 degrees of freedom)
    plan = seed_plan({1: 2.9, 2: 2.92, 3: 2.91}, {4: 3.0, 5: 3.02, 6: 3.01}, -0.09, 0.05)
    n = int(plan["need"])
    effect = 0.09 / (0.01 * math.sqrt(4 / stats.chi2.ppf(0.1, 4)))
    assert TTestIndPower().power(effect, n, 0.05) >= 0.8 > TTestIndPower().power(effect, n - 1, 0.05) if n > 2 else True


# -- attnres next --------------------------------------------------------------------------------
STEADY = [*FAST_GPT2, *BYTES[2:], "--set", "steps=20"]  # the runs' settings, as --set items


def _settings() -> list[str]:
    return [STEADY[i + 1] for i in range(0, len(STEADY), 2) if STEADY[i] == "--set"]


@pytest.mark.integration
def test_next_launches_exactly_its_cells_and_the_report_tests_them_as_planned(workdir):
    """A grid mid-way: two seeds each, unresolved. `attnres next` plans three more seeds per arm (power 0.8 at
    the level of look 2, with σ at its upper bound), `--launch` starts exactly those runs as one stage with the
    plan recorded, and the next report tests the comparison as planned: look 2, planned 5 vs 5, tested at 5 vs 5."""
    store = RunStore(str(workdir / "runs.db"))
    first = store.new_launch(records.LAUNCH)
    spread, jitter = 0.02 / math.sqrt(2), 0.0033  # the same seeds: paired differences -0.0967 and -0.1033
    for variant, mean, e in (("standard", 3.0, 0.0), ("control_block", 2.9, jitter)):
        for seed, value in ((1, mean - spread + e), (2, mean + spread - e)):
            cfg = resolve_run(variant, "tiny", seed, _settings(), "builtin-bytes")
            rid = store.create_run(cfg, status=states.FINISHED, actor=states.IMPORTER, launch_id=first)
            store.update_run(rid, step=20)
            store.log_metrics(rid, [(s, "eval_loss", value + (20 - s) / 100) for s in (0, 10, 20)])
    shown = cli_here("next", "--only", "resolve", check=True).stdout
    # unresolved at look 1: p x 2 above the primary family's α = 0.04
    assert 2 * stats.ttest_1samp([-0.1 + jitter, -0.1 - jitter], 0).pvalue > 0.04
    # paired seeds to resolve at look 2's level (0.04 / 2^2): statsmodels' paired power with σ at its 90% upper
    # confidence bound (chi-square, 1 degree of freedom)
    sd = np.std([-0.1 + jitter, -0.1 - jitter], ddof=1)
    high = sd * math.sqrt(1 / stats.chi2.ppf(0.1, 1))
    n = 5
    assert TTestPower().power(0.1 / high, n, 0.01) >= 0.8 > TTestPower().power(0.1 / high, n - 1, 0.01)
    assert pairs_needed(0.1, sd, 0.01) == 3
    assert (f"control_block vs standard (vs baseline, Δ -0.100, 2 vs 2 seeds): unresolved: ~{n} seeds per arm "
            "(paired; power 0.8 with σ at its 90% upper bound; ~3 at σ as observed)") in shown
    assert f"attnres next --launch` starts these {2 * (n - 2)} run(s)" in shown
    assert "attnres launch control_block standard --seeds 3 4 5 --preset tiny --steps 20 --data builtin-bytes" in shown
    done = cli_here("next", "--launch", "--only", "resolve", *INLINE, check=True)
    assert all(f"run {i}: finished" in done.stdout for i in range(5, 5 + 2 * (n - 2)))
    with sqlite3.connect(workdir / "runs.db") as conn:
        new = conn.execute("select variant, seed, launch_id, status from runs where id > 4 order by id").fetchall()
        plan = conn.execute("select origin, plan_json from launches where id = ?", (new[0][2],)).fetchone()
    assert sorted((v, s) for v, s, _, _ in new) == [(v, s) for v in ("control_block", "standard") for s in (3, 4, 5)]
    assert {lid for _, _, lid, _ in new} == {first + 1} and {st for *_, st in new} == {"finished"}
    assert plan[0] == "next" and f'"n": [{n}, {n}]' in plan[1]
    text = write_report(store, workdir / "r.md", plots=False)
    row = evidence_rows(text)[0]
    values = {v: {s: x for (vv, s), x in _finals(workdir).items() if vv == v} for v in ("control_block", "standard")}
    p = exact_p(values["control_block"], values["standard"])
    assert row["Seeds"] == f"{n} vs {n}" and row["Look"] == "2" and row["p"] == f"{p:.3g}"
    assert row["Holm-adjusted p"] == f"{min(1.0, 4 * p):.3g}"
    assert f"planned {n} vs {n}, tested at {n} vs {n}" in row["Evidence"]
    # planned and launched, the comparison is not planned again (what is left is a new look's count)
    again = cli_here("next", "--only", "resolve", check=True).stdout
    assert "--seeds 3 4 5 " not in again


def _finals(workdir: Path) -> dict[tuple[str, int], float]:
    with sqlite3.connect(workdir / "runs.db") as conn:
        rows = conn.execute("select r.variant, r.seed, m.value from metrics m join runs r on r.id = m.run_id join "
                            "metric_keys k on k.id = m.key_id where k.name = 'eval_loss' and m.step = 20").fetchall()
    return {(v, s): x for v, s, x in rows}


@pytest.mark.integration
def test_next_refuses_bad_input_in_one_line(workdir):
    cli_here("import", str(_tiny_import(workdir)), check=True)
    for args, words in ((["--only", "nope"], "--only nope: choose from resolve, new, retry"),
                        (["--experiment", "nope"], "no runs match --experiment nope"),
                        (["--max-seeds", "1"], "--max-seeds")):
        proc = cli_here("next", *args)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _tiny_import(workdir: Path) -> Path:
    path = workdir / "t.csv"
    pd.DataFrame([{"variant": v, "seed": s, "step": 100, "key": "eval_loss", "value": 3 + s / 100, "preset": "tiny"}
                  for v in ("standard", "control_block") for s in (1, 2)]).to_csv(path, index=False)
    return path


def test_traits_isolate_mechanisms():
    assert traits.traits_of("standard") == {} and traits.mechanisms("control_block") == 0
    pairs = {(a, b): added for a, b, added in traits.contrasts(list(VARIANTS))}
    assert pairs[("block_hybrid_memory", "control_block")] == ["window"]
    assert pairs[("full_attnres", "control_block")] == ["sources"]
    assert pairs[("block_gqa_depth", "control_block")] == ["query_sharing"]  # clean ablations
    assert pairs[("block_source_gain", "control_block")] == ["key_gain"]
    assert pairs[("block_mqa_depth", "control_block")] == ["query_sharing"]
    confounded = {(a, b): added for a, b, added in traits.contrasts(["deep_hybrid_memory", "control_block"])}
    assert sorted(confounded[("deep_hybrid_memory", "control_block")]) == ["deep", "window"]
    assert pairs[("deep_control_block", "deep_baseline")] == ["depth_attention"]
    assert ("block_gqa_depth", "block_mqa_depth") not in pairs  # they differ in a value, neither adds to the other


def test_bench_errors_counts_what_the_written_report_says():
    from attnres.reports.bench import bench_errors

    got = bench_errors(draws=2, variants=2, seeds=(2,), designs=("family-wise", "sequential"))
    assert got["family_wise_2_seeds_draws"] == got["sequential_draws"] == 2
    for design in ("family_wise_2_seeds_variant_resolved", "family_wise_2_seeds_plain_p_below_0.05",
                   "sequential_ever_resolved"):
        assert 0 <= got[f"{design}_ci_low"] <= got[f"{design}_rate"] <= got[f"{design}_ci_high"] <= 1, design
