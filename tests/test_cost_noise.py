"""Cost figures that are load noise (issue 45, section 3): a speed figure carries its run-to-run spread, a run
records the load it trained under (runs under clearly different load are not alike), and one tok/s measure is
named the same in `status`, `compare` and the report."""

from __future__ import annotations

import json
import math
import sqlite3

import pandas as pd
import pytest
from helpers import FAST, attnres, cli_here, in_process
from scipy import stats

from attnres import conditions
from attnres.reports import costs, side_by_side
from attnres.reports.tables import per_variant
from attnres.reports.verdicts import SPEED, cost_benefit
from attnres.training.recorder import LoadSampler

CPU = {"device": "cpu: Xeon", "world_size": 1, "threads": 2, "compile": False, "dtype": "float32",
       "process": "forked"}


def _arms(tps: dict[str, list[float]], loads: dict[str, list[float | None]] | None = None,
          ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs (one per tok/s figure, seeds 1, 2, ...) and their evals at step 100, all under the same conditions."""
    runs, evals = [], []
    for variant, figures in tps.items():
        for i, x in enumerate(figures):
            rid = len(runs) + 1
            load = (loads or {}).get(variant, [None] * len(figures))[i]
            sets = [CPU | ({} if load is None else {conditions.LOAD: load, conditions.LOAD + "_s": 60.0})]
            runs.append({"id": rid, "variant": variant, "seed": i + 1, "status": "finished", "step": 100,
                         "total_steps": 100, "stop_step": None, "final_train_loss": 3.0, "tokens_per_s": x,
                         "peak_memory_bytes": 1e9, "conditions_json": json.dumps(sets), "config_json": "{}"})
            evals.append({"run_id": rid, "step": 100, "value": 3.0 if variant == "standard" else 2.9 + i / 100})
    return pd.DataFrame(runs), pd.DataFrame(evals)


def _speed_cell(tps: dict[str, list[float]], loads: dict[str, list[float | None]] | None = None) -> tuple[str, str]:
    runs, evals = _arms(tps, loads)
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs, preset="tiny")
    return out[SPEED].iloc[0], out.attrs["note"]


def test_the_spread_is_welchs_interval_of_the_log_ratio():
    a, b = [69.0, 85.0, 80.0], [77.0, 92.0]
    low, high = costs.spread(a, b)
    ci = stats.ttest_ind([math.log(x) for x in a], [math.log(x) for x in b], equal_var=False).confidence_interval(0.95)
    assert low == pytest.approx((math.exp(ci.low) - 1) * 100) and high == pytest.approx((math.exp(ci.high) - 1) * 100)
    assert costs.spread([1.0], [1.0, 2.0]) is None and costs.spread([1.0, 1.0], [2.0, 2.0]) == (-50.0, -50.0)


def test_a_difference_within_run_to_run_noise_says_so():
    # the case: standard 77 and 92 tok/s, block_hybrid_memory 85 and 69
    cell, note = _speed_cell({"standard": [77.0, 92.0], "block_hybrid_memory": [85.0, 69.0]})
    low, high = costs.spread([85.0, 69.0], [77.0, 92.0])
    assert low < 0 < high
    assert cell == (f"{(77 / 84.5 - 1) * 100:+.0f}%: within run-to-run noise (±{(high - low) / 2:.0f}%); "
                    "`attnres bench` measures it side by side")
    assert "within run-to-run noise" in note and "Welch's t on the runs' log tok/s" in note
    assert "`attnres bench block_hybrid_memory --preset tiny`" in note  # the command that measures it


def test_a_difference_beyond_the_noise_carries_its_spread():
    cell, _ = _speed_cell({"standard": [1000.0, 1010.0, 995.0], "control_block": [800.0, 806.0, 797.0]})
    low, high = costs.spread([800.0, 806.0, 797.0], [1000.0, 1010.0, 995.0])
    assert high < 0 and cell == f"-20% (±{(high - low) / 2:.0f}%)"


def test_one_run_in_an_arm_means_no_spread_is_known():
    assert _speed_cell({"standard": [100.0], "control_block": [86.0]})[0] == "-14% (one run per arm: spread unknown)"
    assert _speed_cell({"standard": [100.0], "control_block": [86.0, 86.0]})[0] == \
        "-14% (one run of standard: spread unknown)"


def test_compare_gives_the_same_cell_as_the_report():
    tps = {"standard": [77.0, 92.0], "block_hybrid_memory": [85.0, 69.0]}
    runs, _ = _arms(tps)
    got = side_by_side.cost(runs, ["standard", "block_hybrid_memory"]).set_index("variant")["tok/s vs first %"]
    assert got["block_hybrid_memory"] == _speed_cell(tps)[0] and got["standard"] == "+0%"


def test_runs_under_clearly_different_load_are_not_alike():
    tps = {"standard": [100.0, 101.0], "control_block": [60.0, 61.0]}
    cell, note = _speed_cell(tps, {"standard": [0.05, 0.05], "control_block": [0.62, 0.6]})
    assert cell == "not comparable: load 0.60, 0.62 vs 0.05 of the machine"
    assert "`attnres bench control_block --preset tiny`" in note
    # a loaded machine for both arms is not alike either: neither figure measures the variants
    assert _speed_cell(tps, {"standard": [0.55, 0.6], "control_block": [0.6, 0.55]})[0].startswith(
        "not comparable: load ")
    # alike load: divided, with its spread
    assert _speed_cell(tps, {"standard": [0.05, 0.1], "control_block": [0.2, 0.05]})[0].startswith("-40% (±")
    # runs that recorded no load (older runs, imports) are judged by their conditions alone
    assert _speed_cell(tps)[0].startswith("-40% (±")
    runs, _ = _arms(tps, {"standard": [0.05, 0.05], "control_block": [0.62, 0.6]})
    got = side_by_side.cost(runs, ["standard", "control_block"]).set_index("variant")
    assert got.at["control_block", "tok/s measured"] == "not comparable: load 0.60, 0.62 vs 0.05 of the machine"
    assert got.at["control_block", "tok/s vs first %"] == "—"


def test_the_load_sampler_measures_other_processes_share():
    clock, machine, own = [0.0], [0.0], [0.0]
    sampler = LoadSampler(machine=lambda: machine[0], own=lambda: own[0], cores=4, clock=lambda: clock[0])
    sampler.sample()
    assert sampler.share() is None  # one sample: no interval yet
    # 10 s on 4 cores: the machine busy 25 core-s, 5 of them ours -> others 20 of 40
    clock[0], machine[0], own[0] = 10.0, 25.0, 5.0
    sampler.sample()
    assert sampler.share() == pytest.approx(0.5)
    # 10 s more, only ours busy: the mean over both is 20 of 80
    clock[0], machine[0], own[0] = 20.0, 33.0, 13.0
    sampler.sample()
    assert sampler.share() == pytest.approx(0.25) and sampler.seconds == pytest.approx(20.0)
    real = LoadSampler()  # the machine's own counters
    real.sample()
    sum(i * i for i in range(200_000))
    real.sample()
    assert real.share() is None or 0.0 <= real.share() <= 1.0


def test_a_run_keeps_its_load_beside_its_conditions():
    recorded = conditions.merged(None, CPU)
    loaded = conditions.with_load(recorded, CPU, 0.2, 30.0)
    assert json.loads(loaded) == [CPU | {"load": 0.2, "load_s": 30.0}]
    # a second attempt under the same conditions joins the same set: its load averaged by seconds
    again = conditions.merged(loaded, CPU)
    assert json.loads(again) == json.loads(loaded)
    assert json.loads(conditions.with_load(again, CPU, 0.8, 10.0)) == [CPU | {"load": 0.35, "load_s": 40.0}]
    assert costs.run_load(json.loads(conditions.with_load(again, CPU, 0.8, 10.0))) == pytest.approx(0.35)
    # the note's "every run here" names the conditions, not each run's load
    runs, evals = _arms({"standard": [100.0, 101.0], "control_block": [90.0, 91.0]},
                        {"standard": [0.01, 0.02], "control_block": [0.03, 0.04]})
    note = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs).attrs["note"]
    assert "Every run here: cpu: Xeon x 1, 2 thread(s), float32, not compiled, trainer process: forked." in note


def test_status_compare_and_the_report_give_a_run_the_same_tok_s(workdir, capsys, monkeypatch):
    rows = [(v, seed, step, key, value) for v, seed, tps in (("standard", 1, (70.0, 90.0)),
                                                             ("control_block", 1, (60.0, 61.0)))
            for step, key, value in ((0, "eval_loss", 10.0), (50, "tokens_per_s", tps[0]),
                                     (100, "tokens_per_s", tps[1]), (100, "eval_loss", 3.0))]
    pd.DataFrame(rows, columns=["variant", "seed", "step", "key", "value"]).to_csv(workdir / "r.csv", index=False)
    assert in_process(["import", workdir / "r.csv"], capsys, monkeypatch)[0] == 0
    status = cli_here("status", check=True).stdout
    assert "mean tok/s" in status
    line = next(ln for ln in status.splitlines() if " standard " in ln)
    assert " 80 " in line and " 90 " not in line  # the mean of its logged intervals, not the last
    cli_here("report", "--out", "r.md", "--no-plots", check=True)
    text = (workdir / "r.md").read_text()
    assert "| mean tok/s" in text and "80 tok/s" in text
    assert "mean tok/s: a run's tokens/s over its timed steps" in text
    cli_here("compare", "standard", "control_block", "--out", "c.md", check=True)
    assert "80 tok/s" in (workdir / "c.md").read_text()


@pytest.mark.integration
def test_a_trained_run_records_its_load(workdir):
    attnres("launch", "standard", "--seeds", "1", *FAST, "--steps", "10", "--preset", "tiny", check=True)
    with sqlite3.connect("runs.db") as conn:
        (sets,) = conn.execute("select conditions_json from runs").fetchone()
    (recorded,) = json.loads(sets)
    assert 0.0 <= recorded[conditions.LOAD] <= 1.0 and recorded[conditions.LOAD + "_s"] > 0
    assert {k: recorded[k] for k in conditions.CONDITIONS}["world_size"] == 1
    with sqlite3.connect("runs.db") as conn:  # no new metric key: a run's load is no per-step metric
        assert "load" not in {n for (n,) in conn.execute("select name from metric_keys")}
