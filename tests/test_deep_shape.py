"""A variant's name is earned: a deep variant under --set trains its own (deep) model, a launch's dry run and
`variants --params --set` say which model each run trains, and two names of one recorded model are never
ranked or tested as if different."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import cli_here

from attnres.tracking import run_rows, states
from attnres.tracking.db import get_engine
from attnres.variants.registry import resolve_run

SHAPE = ["n_layer=2", "d_model=32", "n_head=2", "seq_len=32"]


@pytest.mark.parametrize("variant", ["deep_baseline", "deep_control_block", "deep_hybrid_memory"])
def test_a_deep_variant_doubles_the_given_depth_at_its_width_ratio(variant):
    shallow = resolve_run("standard", "tiny", 1, SHAPE).model
    deep = resolve_run(variant, "tiny", 1, SHAPE).model
    assert deep.n_layer == 2 * shallow.n_layer and deep.n_head == shallow.n_head
    assert deep.d_model < shallow.d_model and abs(deep.d_model / shallow.d_model - 1080 / 1536) < 0.1
    assert deep.d_model % deep.n_head == 0 and (deep.d_model // deep.n_head) % 2 == 0  # RoPE rotates pairs
    # the preset's own shape is unchanged by the rule's new order (8L d48 at tiny, as recorded before)
    assert (resolve_run(variant, "tiny", 1).model.n_layer, resolve_run(variant, "tiny", 1).model.d_model) == (8, 48)


def test_a_residual_setting_still_changes_the_variants_wiring():
    cfg = resolve_run("control_block", "tiny", 1, ["block_size=2", "n_layer=6"]).model
    assert (cfg.n_layer, cfg.residual.block_size, cfg.residual.kind) == (6, 2, "depth")


def test_a_dry_run_prints_each_runs_model(workdir):
    out = cli_here("launch", "standard", "deep_baseline", "--seeds", "1", *[a for s in SHAPE for a in ("--set", s)],
                   "--dry-run", check=True).stdout
    assert "model: 2 layers, width 32, 2 heads" in out and "model: 4 layers, width 24, 2 heads" in out, out
    assert not (workdir / "runs.db").exists()


def test_variants_params_counts_at_the_settings_given(workdir):
    out = cli_here("variants", "--params", *[a for s in SHAPE[:3] for a in ("--set", s)], check=True).stdout
    row = next(line for line in out.splitlines() if line.strip().startswith("deep_baseline"))
    assert "4L d24 h2" in row, row
    assert "2x the layers" in out  # the rule, documented where the variants are listed
    refused = cli_here("variants", "--set", "n_layer=2")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1 and "--params" in refused.stderr


@pytest.fixture
def twins(workdir):
    """standard and a 'deep_baseline' recorded with standard's very config (as --set trained it before), beside
    control_block: three seeds each, finished at step 20."""
    engine = get_engine(str(workdir / "runs.db"))
    evals = {"standard": [3.00, 3.10, 3.05], "deep_baseline": [2.90, 2.95, 2.92], "control_block": [2.95, 3.0, 2.97]}
    for variant, values in evals.items():
        for seed, value in zip((1, 2, 3), values, strict=True):
            cfg = resolve_run("standard" if variant == "deep_baseline" else variant, "tiny", seed,
                              [*SHAPE, "steps=20"])
            run = run_rows.create_run(engine, replace(cfg, variant=variant), actor=states.IMPORTER,
                                   status=states.FINISHED)
            run_rows.update_run(engine, run, step=20)
            run_rows.log_metrics(engine, run, [(0, "eval_loss", 4.0), (20, "eval_loss", value),
                                            (20, "train_loss", value + 0.1)])
    engine.dispose()
    return workdir


def test_a_report_names_one_model_under_two_names_and_leaves_it_out(twins):
    cli_here("report", "--out", "r.md", "--no-plots", check=True)
    text = (twins / "r.md").read_text()
    assert "Same model as standard" in text
    verdicts = text.split("Cost/Benefit")[1].split("\n## ")[0] if "Cost/Benefit" in text else ""
    assert "deep_baseline" not in verdicts and "control_block" in verdicts, verdicts
    assert "deep_baseline vs standard" not in text and "standard vs deep_baseline" not in text


def test_compare_says_same_model_and_tests_only_the_other_arm(twins):
    out = cli_here("compare", "standard", "deep_baseline", "control_block", check=True).stdout
    assert "deep_baseline: Same model as standard" in out, out
    row = next(line for line in out.splitlines() if "deep_baseline" in line and "untested" in line)
    assert "same model as standard" in row
    assert any("control_block" in line and ("resolved" in line or "unresolved" in line) for line in out.splitlines())
    both = out.split("Welch's and the paired test")[1].split("Config differences")[0]
    assert "control_block" in both and "deep_baseline" not in both


@pytest.mark.parametrize("sets", [SHAPE, ["block_size=2", "n_layer=6"], ["window=2", "d_model=96"], []])
def test_a_variant_that_keeps_its_shape_trains_what_it_trained_before(sets):
    """The rule's new order changes nothing for a variant without a shape rule: its model (and so every recorded
    run's config hash) is the one the old order, variant first and every --set after, gave."""
    from attnres.config import apply_overrides, get_preset
    from attnres.variants.registry import VARIANTS, get_variant

    preset = get_preset("tiny")
    for name, v in VARIANTS.items():
        if v.depth_mult != 1 or v.width_ratio != 1.0:
            continue
        old, _ = apply_overrides(get_variant(name).apply(preset), preset.train, sets)
        assert resolve_run(name, "tiny", 1, sets).model == old, name


@pytest.mark.parametrize("sets", [SHAPE, [], ["d_model=96"], ["n_head=8"]])
def test_a_deep_runs_launch_command_is_found_again(sets):
    """`attnres next` extends a recorded run with the --set that trains it again: for a deep variant that is the
    shape given, which its rule maps to the recorded one (not the recorded shape, which it would deepen again)."""
    from attnres.runs.planning import reproduce

    for variant in ("deep_baseline", "deep_hybrid_memory"):
        cfg = resolve_run(variant, "tiny", 7, [*sets, "steps=60"])
        items = reproduce(cfg.to_json(), cfg.config_hash, "tiny", 7, 60, "")
        assert items is not None, (variant, sets)
        assert resolve_run(variant, "tiny", 7, [*items, "steps=60"]).config_hash == cfg.config_hash


def test_a_deep_shape_with_no_width_to_narrow_is_one_line(workdir):
    refused = cli_here("launch", "deep_baseline", "--seeds", "1", "--set", "d_model=64", "--set", "n_head=32",
                       "--dry-run")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "fewer heads" in refused.stderr and not (workdir / "runs.db").exists()


def test_the_baseline_keeps_its_name_when_another_arm_trained_its_model():
    import pandas as pd

    from attnres.reports.identity import same_models

    config = resolve_run("standard", "tiny", 1).to_json()
    runs = pd.DataFrame({"variant": ["standard", "deep_baseline"], "config_json": [config, config]})
    assert same_models(runs) == {"deep_baseline": "standard"}
    assert same_models(runs, prefer=["deep_baseline"]) == {"standard": "deep_baseline"}
