"""Hyperparameter grids: `--set k=a,b` expands into cells; status, report and compare group by them."""

from __future__ import annotations

import re
import sqlite3

import pandas as pd
import pytest
from helpers import FAST, INLINE, cli_here, in_process, runs

from attnres import run_settings
from attnres.errors import AttnresError
from attnres.reports.tuning import tune
from attnres.runs import grid, planning
from attnres.runs.status_view import grid_rows
from attnres.tracking.run_store import RunStore

# -- expansion and naming (in process) ---------------------------------------------------------------


def test_a_swept_setting_expands_into_variant_x_value_x_seed_cells():
    req = planning.request(["standard", "control_block"], [42, 1337], "tiny", 20,
                           ["lr=1e-3,3e-3", "warmup=2", "weight_decay=0,0.1"])
    assert req.sweep == {"lr": ["1e-3", "3e-3"], "weight_decay": ["0", "0.1"]}
    cells = planning.plan(None, req)
    assert len(cells) == 2 * 2 * 2 * 2
    seen = {(c.cfg.variant, c.cfg.train.lr, c.cfg.train.weight_decay, c.cfg.seed) for c in cells}
    assert len(seen) == 16 and all(c.cfg.train.warmup == 2 and c.cfg.train.steps == 20 for c in cells)
    assert len({c.cfg.config_hash for c in cells}) == 16  # every cell is its own run (de-dup by config)
    # the order: variant, then the swept values (first key slowest), then seed
    assert [(c.cfg.train.lr, c.cfg.train.weight_decay, c.cfg.seed) for c in cells[:4]] == [
        (1e-3, 0.0, 42), (1e-3, 0.0, 1337), (1e-3, 0.1, 42), (1e-3, 0.1, 1337)]


@pytest.mark.parametrize("sets, message", [
    (["lr=1e-3,"], "no empty value"),
    (["lr=1e-3,0.001"], "given twice"),
    (["lr=1e-3,3e-3", "lr=3e-4"], "both fixed and swept"),
    (["lr=1e-3,3e-3", "lr=1,2"], "sweeps lr twice"),
    (["lr=1e-3,abc"], "bad value 'abc' for lr"),
    (["n_layr=1,2"], "n_layr"),
])
def test_a_malformed_sweep_is_one_line(sets, message):
    with pytest.raises(AttnresError, match=message):
        planning.request(["standard"], [1], "tiny", None, sets)


def test_values_are_named_the_same_however_they_were_typed():
    assert run_settings.normal("1e-3") == run_settings.normal(0.001) == run_settings.normal("0.0010") == "0.001"
    assert run_settings.normal("3") == run_settings.normal(3.0) == run_settings.normal(3) == "3"
    assert run_settings.normal(True) == run_settings.normal("True") == "true"
    assert grid.parse_pick(["lr=1E-3"]) == {"lr": "0.001"}
    with pytest.raises(AttnresError):
        grid.parse_pick(["lr=1e-3,3e-3"])


def test_swept_settings_are_read_from_the_runs_within_one_variant():
    def cfg(variant, lr, n_layer=4):
        return planning.resolve_run(variant, "tiny", 1, [f"lr={lr}", f"n_layer={n_layer}"]).to_json()

    of = run_settings.settings
    recorded = [("standard", of(cfg("standard", 1e-3))), ("standard", of(cfg("standard", 3e-3))),
                ("deep_baseline", of(cfg("control_block", 1e-3, 8)))]
    # n_layer differs between variants only (a variant's own shape): not swept; lr differs within one: swept
    assert run_settings.swept_keys(recorded) == ["lr"]
    assert grid.label(recorded[1][1], ["lr"]) == "lr=0.003"
    assert "seed" not in recorded[0][1] and "log_every" not in recorded[0][1]


def _frames(arms):
    """Synthetic runs and evals: ``arms`` maps (variant, lr) -> (status, {step: loss}) for seeds 1 and 2."""
    runs_, evals = [], []
    for (variant, lr), (status, curve_) in arms.items():
        for seed in (1, 2):
            rid = len(runs_) + 1
            config = planning.resolve_run(variant, "tiny", seed, [f"lr={lr}", "steps=200"]).to_json()
            last = max(curve_)
            runs_.append({"id": rid, "variant": variant, "seed": seed, "status": status, "config_json": config,
                          "step": last, "total_steps": 200})
            evals += [{"run_id": rid, "step": s, "value": v + seed / 1000} for s, v in curve_.items()]
    return pd.DataFrame(runs_), pd.DataFrame(evals)


def test_tuning_picks_per_variant_at_the_final_step_and_a_diverged_value_does_not_hold_it_back():
    arms = {("standard", 1e-3): ("finished", {0: 5.0, 100: 3.0, 200: 2.5}),
            ("standard", 3e-3): ("finished", {0: 5.0, 100: 2.9, 200: 3.3}),  # better at 100, worse at the end
            ("standard", 1e-2): ("diverged", {0: 5.0, 100: 2.0}),  # best at 100, then diverged
            ("control_block", 1e-3): ("finished", {0: 5.0, 100: 3.1, 200: 2.9}),
            ("control_block", 3e-3): ("finished", {0: 5.0, 100: 2.9, 200: 2.6}),
            ("control_block", 1e-2): ("diverged", {0: 5.0})}  # diverged before its first eval after 0
    runs_, evals = _frames(arms)
    kept, table = tune(runs_, evals, "lr")
    picked = {(r["Variant"], r["lr"]) for _, r in table[table["Picked"] == "best"].iterrows()}
    assert picked == {("standard", "0.001"), ("control_block", "0.003")}  # each variant its own best, at step 200
    assert set(table["Eval step"]) == {"200"}
    assert table.set_index(["Variant", "lr"]).loc[("standard", "0.01"), "Ended early"] == "2"
    assert sorted(kept["id"]) == [1, 2, 9, 10]


def test_tuning_waits_for_every_seed_of_a_value_still_running():
    arms = {("standard", 1e-3): ("finished", {0: 5.0, 100: 3.0, 200: 2.5}),
            ("standard", 3e-3): ("running", {0: 5.0, 100: 2.9, 200: 2.4})}
    runs_, evals = _frames(arms)
    evals = evals[~((evals["run_id"] == 4) & (evals["step"] == 200))]  # 3e-3's second seed is still at 110
    runs_.loc[runs_["id"] == 4, "step"] = 110
    _, table = tune(runs_, evals, "lr")
    assert set(table["Eval step"]) == {"100 (partial)"}  # the step every seed reached, said to be partial
    assert table.set_index("lr").loc["0.003", "Seeds"] == "2 of 2"
    assert table.set_index("lr").loc["0.003", "Picked"] == "best"  # 2.9 < 3.0 at step 100, both seeds


# -- a real grid: 2 variants x 2 learning rates x 2 seeds ----------------------------------------------


def _eval_means(workdir, step):
    """Per (variant, lr): the mean eval loss at ``step`` over seeds, read straight from the database."""
    with sqlite3.connect(workdir / "runs.db") as conn:
        rows = conn.execute("select r.variant, json_extract(r.config_json, '$.train.lr'), avg(m.value) "
                            "from runs r join metrics m on m.run_id = r.id join metric_keys k on k.id = m.key_id "
                            "where k.name = 'eval_loss' and m.step = ? group by 1, 2", (step,)).fetchall()
    return {(v, run_settings.normal(lr)): mean for v, lr, mean in rows}


@pytest.mark.integration
def test_a_grid_is_grouped_by_its_cells_and_each_variant_is_compared_at_its_best_value(workdir, capsys,
                                                                                       monkeypatch):
    out = cli_here("launch", "standard", "control_block", "--seeds", "42", "1337", *FAST, "--steps", "12",
                   "--set", "log_every=1", "--set", "lr=3e-3,1e-5", *INLINE, check=True).stdout
    assert "standard lr=3e-3 seed=42" in out and "control_block lr=1e-5 seed=1337" in out
    done = runs(workdir)
    assert len(done) == 8 and {r["status"] for r in done} == {"finished"}

    # the cells of one seed share its data order and initial weights: the first step's loss (before any
    # update) is the same at both learning rates, and differs between seeds
    with sqlite3.connect(workdir / "runs.db") as conn:
        first = conn.execute("select r.variant, r.seed, json_extract(r.config_json, '$.train.lr'), m.value from runs r "
                             "join metrics m on m.run_id = r.id join metric_keys k on k.id = m.key_id "
                             "where k.name = 'train_loss' and m.step = 1").fetchall()
    by = {(v, s, lr): x for v, s, lr, x in first}
    for v in ("standard", "control_block"):
        for s in (42, 1337):
            assert by[(v, s, 3e-3)] == by[(v, s, 1e-5)]
        assert by[(v, 42, 3e-3)] != by[(v, 1337, 3e-3)]

    code, shown, _ = in_process(["status"], capsys, monkeypatch)
    assert code == 0 and "settings" in shown and shown.count("lr=0.003") == 4 and shown.count("lr=1e-05") == 4
    header, rows = grid_rows(RunStore(str(workdir / "runs.db")))  # the live grid: a row per variant x cell
    assert header == ["experiment", "variant", "settings", "seed 42", "seed 1337"]
    assert sorted(r[1:3] for r in rows) == [["control_block", "lr=0.003"], ["control_block", "lr=1e-05"],
                                            ["standard", "lr=0.003"], ["standard", "lr=1e-05"]]
    assert all(cell.startswith("finished 12/12") for r in rows for cell in r[3:])

    # the default report compares one cell, never pooling the two rates, and names the other cell
    code, _, err = in_process(["report", "--out", "plain.md", "--no-plots"], capsys, monkeypatch)
    assert code == 0, err
    plain = (workdir / "plain.md").read_text()
    assert re.search(r"Scope: experiment tiny, preset tiny, 12 steps, data builtin-bytes, lr=(0\.003|1e-05)\.",
                     plain)
    assert "--set lr=" in plain.split("## Other Experiments in This Database")[1]

    # --tuned lr: each variant at the rate with its lowest mean eval loss at the last step, said so
    code, _, err = in_process(["report", "--out", "tuned.md", "--no-plots", "--tuned", "lr"], capsys, monkeypatch)
    assert code == 0, err
    tuned = (workdir / "tuned.md").read_text()
    section = tuned.split("## Tuning of lr")[1].split("\n## ")[0]
    means = _eval_means(workdir, 12)
    for v in ("standard", "control_block"):
        best = min(("0.003", "1e-05"), key=lambda lr, v=v: means[(v, lr)])
        row = rf"\| {v} +\| {re.escape(best)} +\| 2 of 2 +\| — +\| 12 +\| {means[(v, best)]:.4f} +\| best +\|"
        assert re.search(row, section), section
        assert f"{v} at lr={best}" in section
    assert "each variant at its best lr" in tuned and "same eval" in section
    # the results table holds each variant's picked runs only: its loss is the picked cell's mean
    results = tuned.split("## Results")[1].split("\n## ")[0]
    best_std = min(("0.003", "1e-05"), key=lambda lr: means[("standard", lr)])
    assert f"| {means[('standard', best_std)]:.3f} ± " in results

    code, shown, err = in_process(["compare", "standard", "control_block", "--tuned", "lr"], capsys, monkeypatch)
    assert code == 0, err
    assert "Tuning of lr" in shown and "best" in shown
    code, shown, err = in_process(["compare", "standard", "control_block", "--set", "lr=1e-5"], capsys, monkeypatch)
    assert code == 0 and "lr=1e-05" in shown, err

    # asking for what is not there is one line, exit 2
    code, _, err = in_process(["report", "--tuned", "warmup", "--out", "x.md"], capsys, monkeypatch)
    assert code == 2 and "warmup has one value" in err and len(err.strip().splitlines()) == 1
    code, _, err = in_process(["report", "--set", "lr=0.5", "--out", "x.md"], capsys, monkeypatch)
    assert code == 2 and "--set lr=0.5" in err

    # launching the same grid again runs nothing: every cell finished with its config
    code, again, err = in_process(["launch", "standard", "control_block", "--seeds", "42", "1337", *FAST, "--steps",
                                   "12", "--set", "log_every=1", "--set", "lr=3e-3,1e-5"], capsys, monkeypatch)
    assert code == 0 and again.count("skip") == 8 and len(runs(workdir)) == 8, err
