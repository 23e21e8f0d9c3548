"""Cost figures from like with like: runs record what their speed depends on, a report divides only
throughputs measured alike, and a paired `attnres bench` stored in the database decides the rest."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import sqlite3

import numpy as np
import pandas as pd
import pytest
from helpers import FAST, INLINE, cli_here

from attnres import conditions
from attnres.reports import costs
from attnres.reports.tables import per_variant
from attnres.reports.verdicts import MEMORY, SPEED, cost_benefit
from attnres.runs.backends.devices import threads_per_process

RUN = [*FAST, "--steps", "10", "--preset", "tiny"]
SETS = [FAST[i + 1] for i in range(len(FAST)) if FAST[i] == "--set"]


def cost_rows(text: str) -> dict[str, list[str]]:
    part = text.split("## Cost/Benefit Summary")[1].split("\n## ")[0]
    return {cells[0]: cells for cells in ([c.strip() for c in ln.strip("|").split("|")]
                                          for ln in part.splitlines() if ln.startswith("| "))}


def test_runs_at_different_thread_counts_are_not_compared_and_a_paired_bench_decides(workdir, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the launcher fits the threads to the cores
    # (trained in this process: what is recorded is the subject, and an inline run records the conditions the
    # same run records under torchrun, test_inline)
    cli_here("launch", "standard", "control_block", "--seeds", "1", *RUN, *INLINE, check=True)
    fit = threads_per_process(1)
    if fit < 2:
        pytest.skip("one core: no other thread count to train at")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one more seed of control_block, at one thread
    cli_here("launch", "control_block", "--seeds", "2", *RUN, *INLINE, check=True)
    with sqlite3.connect("runs.db") as conn:
        recorded = {(v, s): json.loads(c) for v, s, c in
                    conn.execute("select variant, seed, conditions_json from runs order by id")}
    assert [sets[0]["threads"] for sets in recorded.values()] == [fit, fit, 1]
    for sets in recorded.values():
        assert len(sets) == 1 and sets[0]["device"].startswith("cpu") and sets[0]["world_size"] == 1
        assert sets[0]["dtype"] == "float32" and sets[0]["compile"] is False

    cli_here("report", "--out", "r.md", "--no-plots", check=True)
    text = open("r.md").read()
    row = cost_rows(text)["control_block"]
    assert row[2].startswith(f"not comparable: threads 1, {fit} vs {fit}")  # no figure made up (and a busy
    # machine's load may be named after it)
    assert re.fullmatch(r"[+-]\d+%", row[3])  # memory does not depend on the threads: compared as recorded
    assert "Best quality/cost ratio" not in row[4]  # a cost not measured alike ranks nothing
    # the note gives the command that measures it: the runs' model, side by side on this machine
    command = re.search(r"`(attnres bench control_block --preset tiny [^`]*)`", text).group(1)
    assert all(f"--set {s}" in command for s in SETS if s.split("=")[0] in {"n_layer", "d_model", "n_head",
                                                                          "seq_len", "vocab_size", "batch_size"})
    bench = cli_here(*shlex.split(command)[1:], "--steps", "2", "--warmup", "0", check=True)
    assert "recorded as bench 1" in bench.stderr
    cli_here("report", "--out", "r.md", "--no-plots", check=True)
    text = open("r.md").read()
    with sqlite3.connect("runs.db") as conn:
        ratio = dict(conn.execute("select variant, speed_ratio from benchmarks where session = 1").fetchall())
        device = conn.execute("select device from benchmarks").fetchone()[0]
    speed = (ratio["control_block"] / ratio["standard"] - 1) * 100
    assert cost_rows(text)["control_block"][2] == f"{speed:+.0f}% (bench 1, {dt.date.today().isoformat()})"
    assert f"Bench 1: {dt.date.today().isoformat()}, {device}, " in text and "preset tiny" in text
    assert device == recorded[("standard", 1)][0]["device"]


def test_the_launcher_fits_compute_threads_to_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert threads_per_process(1) == cores and threads_per_process(2, 2) == max(1, cores // 4)
    assert threads_per_process(cores * 2) == 1  # never none


def _table(conditions: dict[tuple[str, int], list[dict] | None]) -> tuple[pd.DataFrame, pd.DataFrame]:
    runs, evals = [], []
    for (variant, seed), sets in conditions.items():
        rid = len(runs) + 1
        runs.append({"id": rid, "variant": variant, "seed": seed, "status": "finished", "step": 100,
                     "total_steps": 100, "stop_step": None, "final_train_loss": 3.0,
                     "tokens_per_s": 1000.0 if variant == "standard" else 800.0,
                     "peak_memory_bytes": 1e9 if variant == "standard" else 1.5e9,
                     "conditions_json": json.dumps(sets) if sets is not None else None})
        evals.append({"run_id": rid, "step": 100, "value": 3.0 if variant == "standard" else 2.9 + seed / 100})
    return pd.DataFrame(runs), pd.DataFrame(evals)


GPU = {"device": "NVIDIA H100", "world_size": 8, "threads": 4, "compile": True, "dtype": "bfloat16",
       "process": "interpreter"}


def test_like_with_like_rules():
    # the same conditions everywhere: divided as recorded
    runs, evals = _table({("standard", 1): [GPU], ("control_block", 1): [GPU], ("control_block", 2): [GPU]})
    table = per_variant(runs, evals, 100)
    out = cost_benefit(table, "standard", runs=runs, preset="paper500m")
    assert list(out[SPEED]) == ["-20% (one run of standard: spread unknown)"] and list(out[MEMORY]) == ["+50%"]
    assert ("Every run here: NVIDIA H100 x 8, 4 thread(s), bfloat16, compiled, trainer process: interpreter."
            in out.attrs["note"])
    # another device model: neither figure, and the cell says what differs
    other = GPU | {"device": "NVIDIA A100"}
    runs, evals = _table({("standard", 1): [GPU], ("control_block", 1): [other]})
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs, preset="paper500m")
    assert out[SPEED].iloc[0] == "not comparable: device NVIDIA A100 vs NVIDIA H100"
    assert out[MEMORY].iloc[0] == "not comparable: device NVIDIA A100 vs NVIDIA H100"
    # a run resumed under other conditions mixes them: its own figures are not like with like
    runs, evals = _table({("standard", 1): [GPU], ("control_block", 1): [GPU, GPU | {"world_size": 4}]})
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs, preset="paper500m")
    assert out[SPEED].iloc[0] == "not comparable: world size 4, 8 vs 8"
    # on GPUs the CPU threads hardly matter: not held against the figures
    runs, evals = _table({("standard", 1): [GPU], ("control_block", 1): [GPU | {"threads": 8}]})
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs, preset="paper500m")
    assert out[SPEED].iloc[0] == "-20% (one run per arm: spread unknown)"
    # on a CPU they do: a bench on the runs' device decides the speed; memory does not depend on them
    cpu = {"device": "cpu: Xeon", "world_size": 1, "threads": 2, "compile": False, "dtype": "float32",
           "process": "forked"}
    runs, evals = _table({("standard", 1): [cpu], ("control_block", 1): [cpu | {"threads": 1}],
                          ("control_block", 2): [cpu]})
    benches = pd.DataFrame([
        {"session": 4, "created_at": dt.datetime(2026, 12, 1), "device": "cpu: Xeon", "threads": 2,
         "dtype": "float32", "preset": "tiny", "variant": v, "steps": 10, "speed_ratio": r, "peak_memory_bytes": None}
        for v, r in (("standard", 1.0), ("control_block", 0.9))])
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs, benches=benches, preset="tiny")
    assert out[SPEED].iloc[0] == "-10% (bench 4, 2026-12-01)" and out[MEMORY].iloc[0] == "+50%"
    assert "Bench 4: 2026-12-01, cpu: Xeon, 2 thread(s), float32, not compiled, preset tiny" in out.attrs["note"]
    # a bench on another device is not used
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs,
                       benches=benches.assign(device="cpu: EPYC"), preset="tiny")
    assert out[SPEED].iloc[0] == "not comparable: threads 1, 2 vs 2"
    # how the trainer's process started: no step's speed depends on it; a CPU's peak memory (the whole process's
    # resident set) does, a GPU's (the CUDA allocator's) does not
    runs, evals = _table({("standard", 1): [cpu], ("control_block", 1): [cpu | {"process": "inline"}]})
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs, preset="tiny")
    assert out[SPEED].iloc[0] == "-20% (one run per arm: spread unknown)"
    assert out[MEMORY].iloc[0] == "not comparable: process inline vs forked"
    runs, evals = _table({("standard", 1): [GPU], ("control_block", 1): [GPU | {"process": "forked"}]})
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs, preset="paper500m")
    assert out[MEMORY].iloc[0] == "+50%" and out[SPEED].iloc[0] == "-20% (one run per arm: spread unknown)"
    # runs recorded elsewhere without conditions: divided as recorded, marked, and the note says so
    runs, evals = _table({("standard", 1): None, ("control_block", 1): None})
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs)
    assert out[SPEED].iloc[0] == "-20% (one run per arm: spread unknown; conditions not recorded)"
    assert "control_block and standard: their runs recorded no conditions" in out.attrs["note"]
    assert costs.differences([[GPU]], [[]], ("device",)) == "device NVIDIA H100 vs not recorded"
    # a run resumed by this version after training under an older one: its first steps' conditions are unknown
    resumed = json.loads(conditions.merged(None, GPU, trained_before=True))
    assert resumed == [conditions.UNKNOWN, GPU] and json.loads(conditions.merged(None, GPU)) == [GPU]
    runs, evals = _table({("standard", 1): [GPU], ("control_block", 1): resumed})
    out = cost_benefit(per_variant(runs, evals, 100), "standard", runs=runs)
    assert out[SPEED].iloc[0].startswith("not comparable: device NVIDIA H100, not recorded vs NVIDIA H100")


@pytest.mark.integration
def test_stars_and_labels_follow_the_printed_delta(workdir):
    """On an imported synthetic grid with Δs at the edges of the scale, every star count and label in the
    written document is the rule applied to the Δ as printed (three decimals)."""
    from attnres.reports.stats import stars

    rng = np.random.default_rng(7)
    base = {s: 3.0 + float(rng.normal(0, 0.002)) for s in (1, 2, 3)}
    names = ["control_block", "block_alibi_depth", "block_hybrid_memory", "block_gqa_depth", "block_value_proj",
             "block_rope_depth", "block_sparse_depth"]
    targets = (-0.02496, -0.01504, -0.0004, -0.03449, 0.00049, -0.00951, -0.0195)  # a rounding from a boundary
    values = {"standard": base} | {n: {s: v + t + float(rng.normal(0, 1e-5)) for s, v in base.items()}
                                    for n, t in zip(names, targets, strict=True)}
    pd.DataFrame([{"variant": v, "seed": s, "step": 100, "key": "eval_loss", "value": x, "preset": "tiny"}
                  for v, seeds in values.items() for s, x in seeds.items()]).to_csv("grid.csv", index=False)
    cli_here("import", "grid.csv", check=True)
    cli_here("report", "--out", "r.md", "--no-plots", check=True)
    rows = cost_rows(open("r.md").read())
    assert len(rows) == len(names) + 1  # (the header row)
    for variant in names:
        quality, verdict = rows[variant][1], rows[variant][4]
        printed = float(quality.rsplit("(", 1)[1].rstrip(")"))
        assert quality.split(" (")[0] == stars(printed), quality
        # (+0.00049 prints as +0.000 and is resolved higher: it says so)
        assert verdict.startswith(("Not worth it", "Worse")) == (printed >= 0), (quality, verdict)
        if -printed >= 0.020:
            assert not verdict.startswith(("Modest", "Not worth it")), (quality, verdict)
        elif printed < 0 and "Best" not in verdict:
            assert verdict.startswith("Modest"), (quality, verdict)
    assert rows["block_hybrid_memory"][1] == "☆ (+0.000)"  # -0.0004 prints as +0.000: no star, not worth it
    assert rows["control_block"][1] == "★★★½ (-0.025)" and rows["block_alibi_depth"][1] == "★★½ (-0.015)"


@pytest.mark.integration
def test_document_parameters_are_those_of_attnres_variants(workdir):
    """The Variants table's totals and non-embedding counts at the document's preset, and the deep table's
    differences, are what `attnres variants --params` counts for the same preset."""
    from seed_scenario import rows as seed_rows

    seed_rows().to_csv("seed.csv", index=False)
    cli_here("import", "seed.csv", check=True)
    cli_here("report", "--out", "r.md", "--no-plots", check=True)
    text = open("r.md").read()
    listing = cli_here("variants", "--params", "--preset", "paper500m", check=True).stdout
    counted = {}
    for line in listing.splitlines():
        found = re.match(r"\s*(\w+)\s+\d+L d\d+.*?([\d.]+)M\s+([\d.]+)M\s", line)
        if found:
            counted[found.group(1)] = (float(found.group(2)), float(found.group(3)))
    assert len(counted) >= 12
    shown = {m.group(1): (float(m.group(2)), float(m.group(3))) for m in
             re.finditer(r"^\| (\w+)\s+\|[^|]*\| ([\d.]+)M \(([\d.]+)M non-embedding\)", text, re.MULTILINE)}
    assert set(shown) >= {"standard", "control_block", "block_hybrid_memory", "deep_control_block"}
    for variant, (total, non_emb) in shown.items():
        assert (total, non_emb) == pytest.approx(counted[variant], abs=0.051), variant  # (1 vs 2 decimals)
    deep = text.split("## Deep Variants")[1].split("\n## ")[0]
    got = re.search(r"\| deep_control_block .*?([+-][\d.]+)M \(([+-][\d.]+)%\) non-embedding", deep)
    diff = counted["deep_control_block"][1] - counted["standard"][1]
    assert float(got.group(1)) == pytest.approx(diff, abs=0.06)
    assert float(got.group(2)) == pytest.approx(100 * diff / counted["standard"][1], abs=0.06)
