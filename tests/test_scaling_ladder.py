"""A compute ladder end to end: `attnres scale` plans sizes on a token rule, the trainer records its FLOPs,
`attnres report --scaling` fits a database of runs (synthetic with a known law, and a real tiny ladder)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from helpers import BYTES, INLINE, cli_here, in_process, runs

from attnres.config import RunConfig
from attnres.model.flops import tokens_per_step, training_flops
from attnres.reports import scaling, scaling_doc
from attnres.reports.build_scaling import ladder
from attnres.runs import planning
from attnres.runs.ladder import TokenRule, parse_sizes
from attnres.tracking import states
from attnres.tracking.run_store import RunStore
from attnres.variants.describe import flops_rows, model_params
from attnres.variants.registry import resolve_run

SIZES = ["32x2", "64x2", "96x3", "128x4", "160x4", "192x6"]


def test_a_ladder_is_one_cell_a_size_with_the_steps_of_its_token_rule():
    rule = TokenRule(per_param=20)
    req = planning.request(["standard", "control_block"], [1, 2], "tiny", overrides=["batch_size=8"],
                           ladder=(parse_sizes(["32x2", "64x4x2"]), rule))
    cells = planning.plan(None, req)
    assert len(cells) == 2 * 2 * 2
    for c in cells:
        model = c.cfg.model
        size = (model.d_model, model.n_layer, model.n_head)
        assert size in {(32, 2, 2), (64, 4, 2)}  # heads: the preset's head width (16), or as given
        standard = resolve_run("standard", "tiny", 0, ["batch_size=8", f"d_model={model.d_model}",
                                                       f"n_layer={model.n_layer}", f"n_head={model.n_head}"])
        tokens = 20 * model_params(standard.model)["non_embedding"]  # the size's, whatever the variant
        assert c.cfg.train.steps == math.ceil(tokens / tokens_per_step(standard))
        assert c.cfg.train.batch_size == 8 and c.cfg.experiment_name == "tiny"
    fixed = planning.request(["standard"], [1], "tiny", ladder=(parse_sizes(["32x2,64x2"]), TokenRule(tokens=10**5)))
    assert [c.cfg.train.steps for c in planning.plan(None, fixed)] == [math.ceil(10**5 / (16 * 64))] * 2


@pytest.mark.parametrize(("args", "says"), [
    (["--sizes", "32x"], "bad size '32x'"),
    (["--sizes", "32x2", "32x2", "--tokens", "1M"], "names 32x2 twice"),
    (["--sizes", "40x2", "--tokens", "1M"], "not a multiple of the preset's head width 16"),
    (["--sizes", "32x2"], "needs one token rule"),
    (["--sizes", "32x2", "--tokens", "1M", "--tokens-per-param", "20"], "needs one token rule"),
    (["--sizes", "32x2", "--tokens", "lots"], "bad --tokens 'lots'"),
    (["--sizes", "32x2", "--tokens", "1e400"], "bad --tokens '1e400'"),
    (["--sizes", "32x2", "--tokens-per-param", "1e12"], "up to 1e9"),
    (["--sizes", "32x2", "64x2", "control_block", "--tokens", "1M"], "(variants go before --sizes)"),
    (["--sizes", "32x2", "--tokens-per-param", "-1"], "--tokens-per-param -1"),
    (["--sizes", "32x2", "--tokens", "1M", "--set", "n_layer=3"], "a ladder sets d_model, n_layer"),
    (["--sizes", "32x2", "--tokens", "1M", "--set", "batch_size=4,8"], "sweeps how many tokens a step"),
])
def test_bad_ladders_are_one_line_and_record_nothing(workdir, capsys, monkeypatch, args, says):
    code, _, err = in_process(["scale", "standard", *args], capsys, monkeypatch)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (workdir / "runs.db").exists()
    code, _, err = in_process(["scale", "deep_baseline", "--sizes", "32x2", "--tokens", "1M"], capsys, monkeypatch)
    assert code == 2 and "sets its own depth" in err


def test_variants_params_shows_each_variants_training_flops(capsys, monkeypatch):
    proc = cli_here("variants", "--params", columns=250)  # (the whole table on one line a row)
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, err
    run = resolve_run("control_block", "tiny", 0)
    flops = training_flops(run, model_params(run.model)["non_embedding"])
    rows = {row["variant"]: row for row in flops_rows("tiny")}
    assert rows["control_block"]["train FLOPs"] == f"{flops:.4g}" and rows["standard"]["vs standard"] == "+0.00%"
    assert rows["control_block"]["depth FLOPs/token"] != "0" and rows["standard"]["depth FLOPs/token"] == "0"
    assert code == 0 and "Training compute at tiny" in out and f"{flops:.4g}" in out  # (however wide the table)


def _synthetic_ladder(store: RunStore, law: dict[str, float], worth: float, seeds: int, rng) -> None:
    """Finished runs of standard and control_block at each size (steps from 20 tokens a parameter), their last eval
    loss drawn from ``law`` at their real training compute (control_block's at ``worth`` times it), noise 0.01.
    The odd seeds log no train_flops: their compute is worked out from their recorded config."""
    rungs = planning.request(["standard"], [1], "tiny", ladder=(parse_sizes(SIZES), TokenRule(per_param=20))).ladder
    for rung in rungs:
        for variant, times in (("standard", 1.0), ("control_block", worth)):
            for seed in range(seeds):
                cfg = resolve_run(variant, "tiny", seed, [f"{k}={v}" for k, v in rung.settings.items()],
                                  experiment="ladder")
                compute = training_flops(cfg, model_params(cfg.model)["non_embedding"])
                loss = law["e"] + law["a"] * (times * compute) ** -law["alpha"] + rng.normal(0, 0.01)
                run_id = store.create_run(cfg, status=states.FINISHED, actor=states.IMPORTER, world_size=1)
                store.update_run(run_id, step=cfg.train.steps)
                rows = [(cfg.train.steps, "eval_loss", loss)]
                store.log_metrics(run_id, rows + [(cfg.train.steps, "train_flops", compute)] * (seed % 2 == 0))


def test_the_scaling_study_recovers_a_known_law_from_a_database(workdir, capsys, monkeypatch):
    store = RunStore(str(workdir / "runs.db"))
    c0 = 1e12
    law = {"e": 2.0, "a": 2.0 * c0**0.3, "alpha": 0.3}
    _synthetic_ladder(store, law, worth=1.25, seeds=4, rng=np.random.default_rng(3))
    name, frame = ladder(store, store.run_table())
    assert name == "ladder" and len(frame) == 2 * len(SIZES) * 4 and frame["size"].nunique() == len(SIZES)
    for run in frame.itertuples():  # logged or worked out from the config, the compute is the FLOPs rule's
        cfg = RunConfig.from_dict(json.loads(store.run(run.run_id).config_json))
        assert run.compute == pytest.approx(training_flops(cfg, model_params(cfg.model)["non_embedding"]), rel=1e-12)
    found = scaling.fits(frame, bootstrap=200)
    base = found["standard"]
    for key in ("e", "alpha"):
        lo, hi = base.intervals[key]
        assert lo <= law[key] <= hi, (key, base.intervals)
    value, ci = scaling.multiplier(found["control_block"], base, float(frame["compute"].max()))
    assert ci is not None and ci[0] <= 1.25 <= ci[1] and abs(value - 1.25) < 0.15

    code, _, err = in_process(["report", "--scaling", "--out", workdir / "scaling.md"], capsys, monkeypatch)
    assert code == 0, err
    text = (workdir / "scaling.md").read_text()
    assert "# Scaling study: ladder" in text and "### Compute-equivalent multiplier vs standard" in text
    assert "(scaling_figures/scaling.png)" in text and (workdir / "scaling_figures" / "scaling.png").stat().st_size
    assert all(f"| {size} " in text for size in SIZES)
    # the results document compares one size of the ladder, and says where the study of all of them is
    code, _, err = in_process(["report", "--out", workdir / "main.md", "--no-plots"], capsys, monkeypatch)
    assert code == 0, err
    assert "Experiment ladder is a compute ladder (6 model sizes; this document compares one): `attnres report " \
           "--scaling --experiment ladder`" in (workdir / "main.md").read_text()


def test_a_ladder_below_four_sizes_says_so_and_gives_no_number(workdir, capsys, monkeypatch):
    store = RunStore(str(workdir / "runs.db"))
    for i, d in enumerate((32, 64, 96)):
        cfg = resolve_run("standard", "tiny", 1, [f"d_model={d}", f"n_layer={i + 2}", f"n_head={d // 16}"],
                          experiment="short")
        run_id = store.create_run(cfg, status=states.FINISHED, actor=states.IMPORTER, world_size=1)
        store.update_run(run_id, step=cfg.train.steps)
        store.log_metrics(run_id, [(cfg.train.steps, "eval_loss", 4.0 - i)])
    code, _, _ = in_process(["report", "--scaling", "--no-plots", "--out", workdir / "s.md"], capsys, monkeypatch)
    text = (workdir / "s.md").read_text()
    assert code == 0 and "3 sizes: too few points for a fit" in text
    assert re.search(r"\| standard +\| +3 \| +3 \| — +\|", text) and "Compute-equivalent" not in text


@pytest.mark.integration
def test_a_real_tiny_ladder_trains_records_its_flops_and_fits(workdir):
    ladder_args = ["scale", "standard", "--sizes", "32x1", "64x1", "96x1", "128x1", "--tokens", "40k", "--seeds", "1",
                   *BYTES, "--set", "batch_size=4", "--set", "seq_len=32", "--set", "eval_every=100000",
                   "--set", "eval_batches=2", "--set", "warmup=5", "--set", "log_every=10", *INLINE]
    cli_here(*ladder_args, check=True)
    done = runs(workdir)
    assert [r["status"] for r in done] == ["finished"] * 4 and {r["experiment"] for r in done} == {"tiny-scale"}
    store = RunStore(str(workdir / "runs.db"))
    _, frame = ladder(store, store.run_table())
    last = store.latest_values([r["id"] for r in done], ["train_flops"])
    for run in done:  # the trainer's own count at its last step is the FLOPs rule's for the config it trained
        cfg = RunConfig.from_dict(json.loads(run["config_json"]))
        want = training_flops(cfg, model_params(cfg.model)["non_embedding"])
        assert last[run["id"]]["train_flops"] == pytest.approx(want, rel=1e-9)
    assert sorted(frame["compute"]) == sorted(v["train_flops"] for v in last.values())
    by_compute = frame.sort_values("compute")
    assert list(by_compute["size"]) == ["32x1", "64x1", "96x1", "128x1"]
    assert by_compute["loss"].iloc[-1] < by_compute["loss"].iloc[0] - 0.1  # the same tokens teach the larger more
    fit = scaling.fits(frame)["standard"]
    assert fit.ok and all(map(math.isfinite, (fit.e, fit.a, fit.alpha)))
    grid = np.geomspace(frame["compute"].min(), frame["compute"].max() * 10, 50)
    assert np.all(np.diff(fit.loss(grid)) <= 1e-12)  # the curve falls (or is flat) with compute
    text = cli_here("report", "--scaling", "--out", "scaling.md", check=True)
    again = cli_here(*ladder_args, check=True).stdout  # every cell an ordinary run: a launch again trains nothing
    assert again.count("skip: finished as run") == 4 and len(runs(workdir)) == 4
    document = (workdir / "scaling.md").read_text()
    assert "wrote scaling.md" in text.stdout and re.search(r"\| standard +\| +4 \| +4 \| +[0-9.e+-]+ \|", document)
    assert "Only the baseline 'standard' is in the ladder" in document


def _runs_frame(specs: list[tuple[str, str, list[str]]]) -> pd.DataFrame:
    """A runs table (as the store gives it) of finished runs: (experiment, variant, --set items) each."""
    rows = []
    for i, (experiment, variant, items) in enumerate(specs, 1):
        cfg = resolve_run(variant, "tiny", i % 2, items, experiment=experiment)
        rows.append({"id": i, "experiment": experiment, "variant": variant, "seed": i % 2, "status": "finished",
                     "config_json": cfg.to_json()})
    return pd.DataFrame(rows)


def test_a_deep_variant_beside_the_baseline_is_not_a_ladder_but_a_variant_at_two_sizes_is():
    plain = [("tiny", "standard", []), ("tiny", "deep_baseline", [])]  # 64x4 beside 48x8: one size each
    ladder_ = [("lad", "standard", ["d_model=32", "n_head=2"]), ("lad", "standard", [])]
    assert scaling.ladder_experiments(_runs_frame(plain)) == []
    assert scaling.ladder_experiments(_runs_frame(plain + ladder_)) == ["lad"]
    assert scaling.ladder_note(_runs_frame(plain), "tiny", []) == []


def test_a_swept_ladder_is_a_curve_a_setting_each_against_the_baselines_curve_at_that_setting():
    specs, last = [], {}
    for lr in ("1e-3", "3e-3"):
        for variant in ("standard", "control_block"):
            for d in (32, 64, 96, 128):
                for _ in range(2):
                    specs.append(("lad", variant, [f"d_model={d}", f"n_head={d // 16}", f"lr={lr}"]))
    frame = _runs_frame(specs)
    rng = np.random.default_rng(5)
    for run in frame.itertuples():
        cfg = RunConfig.from_dict(json.loads(run.config_json))
        compute = 1e9 * (cfg.model.d_model / 32) ** 2
        worth = 1.3 if run.variant == "control_block" else 1.0
        lr_shift = 0.2 if cfg.train.lr == 3e-3 else 0.0
        last[run.id] = {"eval_loss": 2 + lr_shift + 30 * (worth * compute) ** -0.15 + rng.normal(0, 0.005),
                        "train_flops": compute}
    last[1] = {"eval_loss": math.nan, "train_flops": 1e9}  # a non-finite loss: left out, and counted
    runs_ = scaling.ladder_runs(frame, last)
    assert set(runs_["variant"]) == {"standard@lr=0.001", "standard@lr=0.003", "control_block@lr=0.001",
                                     "control_block@lr=0.003"} and runs_.attrs["left_out"] == 1
    found = scaling.fits(runs_, bootstrap=50)
    table = scaling_doc.multiplier_table(runs_, found, "standard").set_index("variant")
    assert table.loc["control_block@lr=0.003", "against"] == "standard@lr=0.003"
    assert table.loc["control_block@lr=0.001", "against"] == "standard@lr=0.001"
    assert "standard@lr=0.003" not in table.index  # a baseline's curve is not compared with another's
    text = scaling_doc.document(runs_, found, "standard", "lad", {})
    assert "1 finished run left out" in text and "### Compute-equivalent multiplier vs standard" in text


def test_an_unbounded_replicate_makes_the_interval_unbounded_never_nan():
    base = scaling.Fit("standard", 8, 4, e=1.0, a=1.0, alpha=0.5, intervals={"e": (0.9, 3.1)},
                       replicates=[(1.0, 1.0, 0.5)] * 50 + [(3.0, 1.0, 0.5)] * 50)  # half with a floor above 2
    variant = scaling.Fit("v", 8, 4, e=2.0, a=1e-9, alpha=0.5, intervals={"e": (1.9, 2.1)},
                          replicates=[(2.0, 1e-9, 0.5)] * 100)
    value, ci = scaling.multiplier(variant, base, 1.0)
    assert math.isfinite(value) and ci is not None and ci[1] == math.inf and math.isfinite(ci[0])


def test_a_ladder_divides_its_tokens_by_every_rank_of_a_run():
    from attnres.runs import backends

    placement = backends.get("slurm").placement(1, {"nodes": 2, "gpus_per_node": 4})
    req = planning.request(["standard"], [1], "tiny", backend="slurm", placement=placement,
                           ladder=(parse_sizes(["32x2"]), TokenRule(tokens=10**6)))
    (cell,) = planning.plan(None, req)
    assert cell.cfg.train.steps == math.ceil(10**6 / (16 * 64 * 2 * 4))  # 2 nodes x 4 GPUs: 8 ranks a step


def test_report_scaling_refuses_a_scope_option_it_would_ignore(workdir, capsys, monkeypatch):
    _synthetic_ladder(RunStore(str(workdir / "runs.db")), {"e": 2.0, "a": 2.0 * 1e12**0.3, "alpha": 0.3}, 1.0, 1,
                      np.random.default_rng(0))
    code, _, err = in_process(["report", "--scaling", "--budget", "5", "--out", workdir / "s.md"], capsys,
                              monkeypatch)
    assert code == 2 and "--budget picks a scope of the results document" in err and not (workdir / "s.md").exists()
