"""Figures and comparisons that say what the statistics say: the Δ band is the table's interval of the
difference (paired or Welch, at the level of the table's decision), compare takes cells of one variant as
arms, --on-end says when its line needs a shell, and every output option creates its folders."""

from __future__ import annotations

import math
import shlex
import subprocess

import numpy as np
import pandas as pd
import pytest
from helpers import arms_csv, in_process
from scipy import stats

from attnres.reports import document, plots
from attnres.reports.build import compare
from attnres.reports.document import Inputs
from attnres.reports.evidence import family_alpha
from attnres.reports.scope import select
from attnres.reports.stats import decision_confidence, design, interval
from attnres.runs import planning
from attnres.tracking import states
from attnres.tracking.run_store import RunStore
from attnres.variants.registry import VARIANTS, resolve_run

STEPS = [0, 25, 50, 75, 100]


def curve(final: float) -> dict[int, float]:
    """An eval curve from 10 down to ``final`` at step 100."""
    return {s: 10 + (final - 10) * s / 100 for s in STEPS}


def ci_by_hand(a: dict[int, float], b: dict[int, float], level: float) -> tuple[float, float]:
    """The textbook interval of mean(a) - mean(b): paired over shared seeds, else Welch-Satterthwaite."""
    q = 1 - (1 - level) / 2
    if set(a) == set(b):
        d = np.array([a[s] - b[s] for s in sorted(a)])
        half = stats.t.ppf(q, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        return d.mean() - half, d.mean() + half
    x, y = np.array(list(a.values())), np.array(list(b.values()))
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    half = stats.t.ppf(q, df) * math.sqrt(va + vb)
    return x.mean() - y.mean() - half, x.mean() - y.mean() + half


def evidence_rows(text: str) -> dict[str, dict[str, str]]:
    """The Statistical Evidence table of a document: comparison -> column -> cell."""
    part = text.split("## Statistical Evidence")[1].split("\n## ")[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("|") and "---" not in ln]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return {cells[0]: dict(zip(head, cells, strict=True))
            for cells in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:])}


def band_at(fig, step: int) -> tuple[float, float]:
    """The (lower, upper) edge of the one band a Δ figure draws, at ``step``."""
    ax = fig.axes[0]
    polys = [c for c in ax.collections if len(c.get_paths()) and c.get_paths()[0].vertices.shape[0] > 2]
    assert len(polys) == 1
    v = polys[0].get_paths()[0].vertices
    ys = v[np.isclose(v[:, 0], step), 1]
    return float(ys.min()), float(ys.max())


def analysed(db: str):
    store = RunStore(db, create=False)
    runs, scope, _ = select(store.run_table(), baseline="standard")
    res = store.load_results(runs=runs)
    inp = Inputs(res.runs, res.evals, scope, {v.name: v.description for v in VARIANTS.values()}, [], "standard")
    _, _, a = document.report_parts(inp)
    return res, a


# Welch: control_block's seeds barely vary, standard's a lot; a band of control_block's seeds alone
# excluded 0 while Welch's p is 0.6. Paired: hybrid and gqa share standard's seeds; hybrid is resolved,
# gqa's raw p is below 0.05 but not after the sequential look and Holm over the family.
SCENARIO = {
    "standard": {1: 3.00, 2: 3.30, 3: 2.70},
    "control_block": {4: 2.90, 5: 2.91, 6: 2.92},
    "block_hybrid_memory": {1: 2.80, 2: 3.11, 3: 2.49},
    "block_gqa_depth": {1: 2.95, 2: 3.26, 3: 2.64},
}


def test_the_delta_band_is_the_tables_interval_of_the_difference(workdir, capsys, monkeypatch):
    db = str(workdir / "runs.db")
    assert in_process(["import", arms_csv(workdir, SCENARIO, steps=STEPS), "--db", db], capsys, monkeypatch)[0] == 0
    code, _, err = in_process(["report", "--out", "r.md", "--db", db], capsys, monkeypatch)
    assert code == 0, err
    table = evidence_rows((workdir / "r.md").read_text())
    res, a = analysed(db)
    tests = {c.a: c for c in a.tests if c.b == "standard"}
    assert set(tests) == {"control_block", "block_hybrid_memory", "block_gqa_depth"}
    raw_small_but_unresolved = False
    for variant, c in tests.items():
        row = table[f"{variant} vs standard"]
        lo, hi = c.ci
        # the table's interval: the test's (paired over the same seeds, else Welch) at the decision's level
        assert (lo, hi) == pytest.approx(ci_by_hand(SCENARIO[variant], SCENARIO["standard"], c.ci_level), abs=1e-9)
        assert c.ci_level == pytest.approx(decision_confidence(c.p, c.p_adj, family_alpha(c.family)))
        assert row["Δ interval"].startswith(f"[{lo:+.3f}, {hi:+.3f}]")
        assert row["Test"] == ("Welch" if variant == "control_block" else "paired (3 pairs)")
        # the figure draws that same interval at the compared step
        fig = plots.delta_curves(res.runs, res.evals, "standard", [variant], bands=document.bands(a))
        assert band_at(fig, c.step) == pytest.approx((lo, hi), abs=1e-9)
        assert (lo <= 0 <= hi) == (not c.resolved) == (not row["Evidence"].startswith("resolved"))
        raw_small_but_unresolved |= c.p < 0.05 and not c.resolved
    # the cost figure's bars are the same intervals (not one arm's spread)
    fig = plots.throughput_vs_delta(a.table.assign(tokens_per_s=1000.0), "standard",
                                    {v: c.ci for v, c in tests.items()})
    bars = sorted(tuple(sorted(seg[:, 1])) for col in fig.axes[0].collections for seg in col.get_segments())
    want = sorted(c.ci for c in tests.values())
    assert [x for bar in bars for x in bar] == pytest.approx([x for bar in want for x in bar])
    assert tests["block_hybrid_memory"].resolved and not tests["control_block"].resolved
    assert raw_small_but_unresolved  # a plain 95% interval would have excluded 0 here, against the table
    # the old band (the variant's seeds alone) excluded 0 for control_block; the difference's does not
    alone = stats.t.interval(0.95, 2, loc=np.mean([2.90, 2.91, 2.92]) - 3.0, scale=stats.sem([2.90, 2.91, 2.92]))
    assert alone[1] < 0 and tests["control_block"].ci[0] < 0 < tests["control_block"].ci[1]


def cell_run(store, variant: str, seed: int, lr: str, final: float) -> int:
    cfg = resolve_run(variant, "tiny", seed, ["steps=100", f"lr={lr}"])
    run_id = store.create_run(cfg, status=states.FINISHED, actor=states.IMPORTER)
    store.update_run(run_id, step=100)
    store.log_metrics(run_id, [(s, "eval_loss", v) for s, v in curve(final).items()]
                      + [(100, "tokens_per_s", 1000.0), (100, "peak_memory_bytes", 1e9)])
    return run_id


def test_compare_takes_two_settings_of_one_variant_as_arms(workdir, capsys, monkeypatch):
    db = str(workdir / "runs.db")
    store = RunStore(db)
    low = {1: 3.00, 2: 3.10, 3: 2.95}
    high = {1: 2.93, 2: 3.05, 3: 2.86}  # the same seeds: paired
    other = {7: 2.90, 8: 3.00}  # lr=1e-2 on other seeds: Welch
    for lr, arm in (("1e-3", low), ("3e-3", high), ("1e-2", other)):
        for seed, final in arm.items():
            cell_run(store, "control_block", seed, lr, final)
    cell_run(store, "standard", 1, "1e-3", 3.2)
    result = compare(store, ["control_block@lr=1e-3", "control_block@lr=3e-3", "control_block@lr=0.01"])
    assert result.variants == ["control_block@lr=0.001", "control_block@lr=0.003", "control_block@lr=0.01"]
    s = result.stats.set_index("variant")
    rel = stats.ttest_rel(list(high.values()), list(low.values()))
    welch_high = stats.ttest_ind(list(high.values()), list(low.values()), equal_var=False)
    row = s.loc["control_block@lr=0.003"]
    assert row["test"] == "paired (3 pairs)" and row["p"] == pytest.approx(rel.pvalue)
    assert (row["paired_t"], row["paired_p"]) == pytest.approx((rel.statistic, rel.pvalue))
    assert (row["welch_t"], row["welch_p"]) == pytest.approx((welch_high.statistic, welch_high.pvalue))
    welch = stats.ttest_ind(list(other.values()), list(low.values()), equal_var=False)
    row2 = s.loc["control_block@lr=0.01"]
    assert row2["test"] == "Welch" and (row2["welch_t"], row2["p"]) == pytest.approx((welch.statistic, welch.pvalue))
    # Holm over the two tests, and each interval at the level that agrees with its Holm decision
    holm = s.loc[["control_block@lr=0.003", "control_block@lr=0.01"], "holm_p"].to_numpy()
    from statsmodels.stats.multitest import multipletests
    assert holm == pytest.approx(multipletests([rel.pvalue, welch.pvalue], method="holm")[1])
    for name, arm in (("control_block@lr=0.003", high), ("control_block@lr=0.01", other)):
        level = decision_confidence(s.loc[name, "p"], s.loc[name, "holm_p"])
        assert (s.loc[name, "delta_low"], s.loc[name, "delta_high"]) == pytest.approx(ci_by_hand(arm, low, level))
        assert (s.loc[name, "delta_low"] <= 0 <= s.loc[name, "delta_high"]) == (s.loc[name, "evidence"] == "unresolved")
    # two arms: 95%, and compare's figure draws the table's interval at the compared step
    pair = compare(store, ["control_block@lr=1e-3", "control_block@lr=3e-3"], plot=workdir / "fig" / "c.png")
    got = pair.stats.set_index("variant").loc["control_block@lr=0.003"]
    assert got["level"] == "95%" and (got["delta_low"], got["delta_high"]) == pytest.approx(rel.confidence_interval())
    assert (workdir / "fig" / "c.png").stat().st_size > 10_000
    # from the command line, a variant against a cell of another, the scope's other cell named on error
    code, _, err = in_process(["compare", "standard", "control_block@lr=1e-3", "--db", db, "--out", "o/c.md"],
                                capsys, monkeypatch)
    assert code == 0, err
    assert "control_block@lr=0.001" in (workdir / "o" / "c.md").read_text()
    code, _, err = in_process(["compare", "control_block@lr=1e-3", "control_block@lr=5e-3", "--db", db],
                              capsys, monkeypatch)
    assert code == 2 and "no runs of control_block@lr=0.005" in err and "lr=0.003" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = in_process(["compare", "control_block", "standard", "--set", "lr=1e-3", "--db", db], capsys,
                              monkeypatch)
    assert code == 0, err
    for bad in (["control_block@lr"], ["control_block@lr=1,lr=2"], ["control_block@lr=1e-3", "control_block@lr=1e-3"]):
        code, _, err = in_process(["compare", *bad, "--db", db], capsys, monkeypatch)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
    code, _, err = in_process(["compare", "control_block", "control_block@lr=3e-3", "--db", db], capsys, monkeypatch)
    assert code == 2 and "3 cells" in err and "control_block@lr=0.001" in err


@pytest.mark.integration
def test_on_end_with_shell_syntax_is_named_with_the_form_that_works(workdir, capsys, monkeypatch):
    line = "echo finished $ATTNRES_RUN_ID >> " + str(workdir / "x")
    code, _, err = in_process(["launch", "standard", "--dry-run", "--on-end", line], capsys, monkeypatch)
    assert code == 0 and "without a shell" in err and ">>" in err and "$ATTNRES_RUN_ID" in err
    suggested = err.strip().rsplit("--on-end ", 1)[1]
    argv = shlex.split(shlex.split(suggested)[0])  # as the user's shell, then launch, split it
    assert argv[:2] == ["sh", "-c"]
    subprocess.run(argv, env={"ATTNRES_RUN_ID": "7", "PATH": "/usr/bin:/bin"}, check=True)
    assert (workdir / "x").read_text() == "finished 7\n"
    assert planning.on_end_warning(suggested.strip("'")) is None  # a shell already: nothing to say
    for plain in ("notify-send attnres", 'curl -s -d "a > b" ntfy.sh/lab'):
        assert planning.on_end_warning(plain) is None
    for shell in ("a && b", "cmd | tee log", "cmd 2>&1", "echo `date`"):
        assert "sh -c" in planning.on_end_warning(shell)


def test_every_output_option_creates_its_folders_and_refuses_a_file_in_the_way(workdir, capsys, monkeypatch):
    db = str(workdir / "runs.db")
    in_process(["import", arms_csv(workdir, SCENARIO, steps=STEPS), "--db", db], capsys, monkeypatch)
    (workdir / "taken").write_text("a file")
    for args in (["report", "--out", "taken/r.md"], ["compare", "standard", "control_block", "--out", "taken/c.md"],
                 ["compare", "standard", "control_block", "--plot", "taken/c.png"],
                 ["export", "--out", "taken/exp"]):
        code, _, err = in_process([*args, "--db", db], capsys, monkeypatch)
        assert code == 2 and "taken" in err and len(err.strip().splitlines()) == 1, (args, err)
    assert (workdir / "taken").read_text() == "a file"
    for args, made in ((["report", "--out", "a/b/r.md"], "a/b/r_figures/delta_curves.png"),
                       (["compare", "standard", "control_block", "--out", "c/d/c.md", "--plot", "e/f.png"], "e/f.png"),
                       (["export", "--out", "g/h"], "g/h/runs.csv")):
        code, _, err = in_process([*args, "--db", db], capsys, monkeypatch)
        assert code == 0 and (workdir / made).exists(), (args, err)
    assert (workdir / "c/d/c.md").exists() and (workdir / "a/b/r.md").exists()


def test_interval_equals_scipy_and_is_undefined_without_a_spread():
    a, b = {1: 2.9, 2: 3.0, 3: 2.8}, {1: 3.0, 2: 3.2, 3: 2.95}
    assert interval(a, b) == pytest.approx(tuple(stats.ttest_rel([2.9, 3.0, 2.8], [3.0, 3.2, 2.95])
                                                 .confidence_interval()))
    c = {4: 3.1, 5: 3.3}
    assert interval(a, c, 0.9) == pytest.approx(tuple(stats.ttest_ind([2.9, 3.0, 2.8], [3.1, 3.3], equal_var=False)
                                                      .confidence_interval(0.9)))
    assert all(math.isnan(x) for x in interval({1: 1.0}, {1: 2.0}) + interval({1: 1, 2: 1}, {3: 2, 4: 2}))


def test_a_report_of_one_swept_variant_points_to_comparing_its_cells(workdir, capsys, monkeypatch):
    db = str(workdir / "one.db")
    store = RunStore(db)
    for lr, final in (("1e-3", 3.0), ("3e-3", 2.9)):
        for seed in (1, 2):
            cell_run(store, "control_block", seed, lr, final + seed / 100)
    code, _, err = in_process(["report", "--out", "r.md", "--db", db], capsys, monkeypatch)
    assert code == 2 and "attnres compare control_block@lr=0.00" in err, err
    arms = err.split("`attnres compare ")[1].split("`")[0].split()
    assert in_process(["compare", *arms, "--db", db], capsys, monkeypatch)[0] == 0
    # with --tuned, its values are the arms, against its default value (the tiny preset's lr, 0.003)
    code, _, err = in_process(["report", "--out", "r.md", "--db", db, "--tuned", "lr", "--no-plots"], capsys,
                              monkeypatch)
    assert code == 0, err
    text = (workdir / "r.md").read_text()
    assert "Baseline = control_block@lr=0.003" in text and "| control_block@lr=0.001" in text


def _band_one_step_at_a_time(runs, evals, variant, baseline, confidence=0.95, run_ids=None):
    """The Δ band as it was computed before it was vectorised (one scipy test per step), kept as the reference
    the vectorised one must equal."""
    from attnres.reports.stats import finite

    keep = runs if run_ids is None else runs[runs["id"].isin(list(run_ids))]
    keep = keep[keep["variant"].isin([variant, baseline])].sort_values("id")
    keep = keep.drop_duplicates(["variant", "seed"], keep="last")
    ev = finite(evals).merge(keep[["id", "variant", "seed"]], left_on="run_id", right_on="id")
    rows = []
    for st, at in ev.groupby("step"):
        arms = {v: dict(zip(g["seed"].astype(int), g["value"].astype(float), strict=True))
                for v, g in at.groupby("variant")}
        a, b = arms.get(variant), arms.get(baseline)
        if not a or not b:
            continue
        lo, hi = interval(a, b, confidence)
        rows.append((int(st), float(np.mean(list(a.values())) - np.mean(list(b.values()))), lo, hi, len(a),
                     design(a, b) if len(a) >= 2 and len(b) >= 2 else ""))
    return pd.DataFrame(rows, columns=["step", "delta", "lo", "hi", "n", "test"])


def test_the_vectorised_delta_band_equals_one_test_per_step():
    """The Δ figure's band (issue 48: 27,000 scipy tests in a 600k-row report) is computed over all steps at once:
    the same steps, Δ, interval, seed count and test as one test per step, over seeds that end early, reruns, arms
    with other seeds, one seed, flat differences and a step only one arm reached."""
    rng = np.random.default_rng(48)
    for case in range(60):
        runs, evals, rid = [], [], 0
        for variant in ("standard", "control_block"):
            seeds = rng.choice([1, 2, 3, 4, 5], size=int(rng.integers(1, 5)), replace=False)
            for seed in seeds:
                for _ in range(int(rng.integers(1, 3))):  # sometimes a rerun of the seed
                    rid += 1
                    last = int(rng.choice([40, 100, 100, 100]))  # some end early
                    runs.append({"id": rid, "variant": variant, "seed": int(seed)})
                    flat = case % 7 == 0
                    for step in range(0, last + 1, 10):
                        value = 3.0 - step / 1000 + (0.0 if flat else float(rng.normal(0, 0.01)))
                        evals.append({"run_id": rid, "step": step, "value": value})
        runs, evals = pd.DataFrame(runs), pd.DataFrame(evals)
        picked = None if case % 3 else list(runs["id"].sample(frac=0.8, random_state=case))
        for confidence in (0.95, 0.9875):
            got = plots.delta_series(runs, evals, "control_block", "standard", confidence, picked)
            want = _band_one_step_at_a_time(runs, evals, "control_block", "standard", confidence, picked)
            assert list(got["step"]) == list(want["step"]) and list(got["n"]) == list(want["n"]), case
            assert list(got["test"]) == list(want["test"]), case
            for col in ("delta", "lo", "hi"):
                assert np.allclose(got[col].astype(float), want[col].astype(float), rtol=0, atol=1e-12,
                                   equal_nan=True), (case, col)
