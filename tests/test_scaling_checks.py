"""Scaling fits that know when they do not hold (issue 46): a bending or flat ladder is flagged and its
multipliers withheld, a clean law is not; extrapolation is marked past the ladder and withheld with under two
residual degrees of freedom; runs too short for their schedule or size are named; the document says, with its
figures, what the ladder cannot conclude. Pure functions over DataFrames, in process."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from helpers import cli_here

from attnres.reports import bench_scaling, scaling, scaling_checks, scaling_doc

C0 = 1e12
SEEDS = (-0.012, 0.0, 0.012)  # each size's seeds sit symmetrically around its curve: seed noise, no lack of fit


def clean(x: np.ndarray) -> np.ndarray:
    return 2.0 + 1.0 * x**-0.3


def bending(x: np.ndarray) -> np.ndarray:
    """A sum of two power laws whose bend a single law misses by far more than the seeds' spread."""
    return 2.0 + 1.2 * x**-1.2 + 1.2 * x**-0.1


def flat(x: np.ndarray) -> np.ndarray:
    return np.full_like(x, 3.15)


def rising(x: np.ndarray) -> np.ndarray:
    return 3.0 + 0.05 * np.log10(x)


def runs_of(curves: dict[str, object], sizes: int = 6, worth: dict[str, float] | None = None,
            seeds: tuple[float, ...] = SEEDS) -> pd.DataFrame:
    """A ladder over two decades: each variant's seeds at ``curve(x · worth)`` plus the offsets ``seeds``."""
    rows = []
    for i, x in enumerate(np.geomspace(1, 100, sizes)):
        for name, curve in curves.items():
            mean = float(curve(np.array(x * (worth or {}).get(name, 1.0))))
            rows += [{"variant": name, "setting": "", "seed": s, "size": f"s{i}", "compute": C0 * x,
                      "loss": mean + off} for s, off in enumerate(seeds)]
    return pd.DataFrame(rows)


def checked(runs: pd.DataFrame, bootstrap: int = 0) -> tuple[dict[str, scaling.Fit], dict[str, scaling_checks.Check]]:
    found = scaling.fits(runs, bootstrap)
    return found, scaling_checks.check_all(runs, found)


def test_a_bending_and_a_flat_ladder_are_flagged_and_a_clean_law_is_not():
    runs = runs_of({"standard": clean, "bent": bending, "flat": flat, "rising": rising})
    found, checks = checked(runs)
    assert not checks["standard"].fails and checks["standard"].checked and checks["standard"].lof_p > 0.5
    assert checks["bent"].misfit and checks["bent"].fails == "law misfits" and checks["bent"].lof_p < 1e-3
    assert checks["bent"].miss > 1.5 * checks["bent"].sigma  # the bend is well outside the seeds' spread
    assert checks["flat"].flat and checks["flat"].fails == "no decline"
    assert checks["rising"].slope > 0 and checks["rising"].slope_p > 0.99 and checks["rising"].fails == "no decline"
    assert checks["standard"].slope_p < 1e-6
    assert checks["standard"].dof == 3 and checks["standard"].pure_dof == 12  # sizes − 3; runs − sizes
    notes = scaling.fit_table(found, {n: scaling_doc.check_note(c) for n, c in checks.items()}).set_index("variant")
    assert "the law does not describe this ladder (lack of fit p = " in notes.loc["bent", "note"]
    assert "no decline with compute" in notes.loc["flat", "note"]
    assert notes.loc["standard", "note"].startswith("lack of fit p = ")


def test_multipliers_are_withheld_for_a_flagged_variant_and_given_for_a_clean_one():
    runs = runs_of({"standard": clean, "attnres": clean, "bent": bending, "flat": flat},
                   worth={"attnres": 1.25})
    found, checks = checked(runs, bootstrap=100)
    table = scaling_doc.multiplier_table(runs, found, "standard", checks).set_index("variant")
    assert set(table.loc["bent"]) == {"withheld (law misfits)"}
    assert set(table.loc["flat"]) == {"withheld (no decline)"}
    given = table.loc["attnres"]
    assert all(cell.startswith("1.2") for cell in given), given  # the true 1.25×, at the ladder and past it
    assert "10× largest (extrapolated)" in table.columns and "100× largest (extrapolated)" in table.columns


def test_a_flagged_baseline_withholds_every_comparison_against_it():
    runs = runs_of({"standard": bending, "attnres": bending}, worth={"attnres": 1.25})
    found, checks = checked(runs)
    cells = scaling_doc.multiplier_table(runs, found, "standard", checks).iloc[0].drop("variant")
    assert set(cells) == {"withheld (law misfits)"}


def test_extrapolation_is_withheld_under_two_residual_dof_and_marked_past_the_horizon():
    four = runs_of({"standard": clean, "attnres": clean}, sizes=4, worth={"attnres": 1.25})
    found, checks = checked(four, bootstrap=50)
    assert checks["standard"].dof == 1 and checks["standard"].far == "1 residual dof"
    row = scaling_doc.multiplier_table(four, found, "standard", checks).iloc[0]
    assert row["10× largest (extrapolated)"] == row["100× largest (extrapolated)"] == "withheld (1 residual dof)"
    assert row["s3"].startswith("1.2")  # inside the ladder the multiplier stands
    text = scaling_doc.section(four, "standard", found=found, bootstrap=50)
    assert ("4 sizes leave the law 1 residual degree of freedom (sizes − 3 parameters; 2 are needed): too few to "
            "judge it past the ladder") in text
    five = runs_of({"standard": clean, "attnres": clean}, sizes=5, worth={"attnres": 1.25})
    found, checks = checked(five, bootstrap=50)
    row = scaling_doc.multiplier_table(five, found, "standard", checks).iloc[0]
    assert checks["standard"].far == "" and row["10× largest (extrapolated)"].startswith("1.2")
    text = scaling_doc.section(five, "standard", found=found, bootstrap=50)
    assert "Multipliers at 10× and 100× the largest compute (1e+14 FLOPs, this ladder's horizon) are " \
           "extrapolations" in text


def test_a_ladder_of_four_sizes_is_warned_before_it_trains_that_it_will_not_extrapolate():
    from attnres.runs.ladder import parse_sizes, warning

    assert "1 residual degree of freedom" in warning(parse_sizes(["32x2", "64x2", "96x3", "128x4"]))
    assert "fits a variant from 4 sizes on" in warning(parse_sizes(["32x2", "64x2", "96x3"]))
    assert warning(parse_sizes(["32x2", "64x2", "96x3", "128x4", "160x4"])) is None


def test_one_seed_a_size_leaves_the_law_unchecked_and_gives_nothing_past_the_ladder():
    runs = runs_of({"standard": clean, "attnres": clean}, worth={"attnres": 1.25}, seeds=(0.0,))
    found, checks = checked(runs)
    assert not checks["standard"].checked and checks["standard"].far == "unchecked"
    row = scaling_doc.multiplier_table(runs, found, "standard", checks).iloc[0]
    assert row["10× largest (extrapolated)"] == "withheld (unchecked)" and row["s5"].startswith("1.2")
    assert "one seed a size: the law's fit cannot be judged against seed noise" in scaling_doc.section(
        runs, "standard", found=found)


def test_runs_short_for_their_schedule_or_their_size_are_flagged_and_said_so():
    runs = runs_of({"standard": clean}, sizes=4)
    params = runs["size"].map({"s0": 26_784, "s1": 106_816, "s2": 332_448, "s3": 803_968})
    runs = runs.assign(steps=49.0, warmup=20.0, tokens=50_176.0, params=params.astype(float))
    short = scaling_checks.short_runs(runs)
    assert len(short) == len(runs) and short["by_warmup"].all() and short["by_tokens"].all()
    ok = runs.assign(steps=2000.0, warmup=100.0, tokens=runs["params"] * 20)
    assert scaling_checks.short_runs(ok).empty and scaling_doc.short_sentences(ok) == []
    assert scaling_checks.short_runs(runs_of({"standard": clean})).empty  # no budgets recorded: nothing said
    said = " ".join(scaling_doc.short_sentences(runs))
    assert "12 of 12 runs spent 25% or more of their steps warming the learning rate up (20 of 49 steps, 41%)" in said
    assert "12 of 12 runs trained on fewer than 5 tokens a non-embedding parameter (0.062 to 1.9, sizes s0, s1, s2, " \
           "s3; Chinchilla's compute-optimal ratio is about 20)" in said
    assert "not on a compute-efficient frontier" in said
    table = scaling.ladder_table(runs)
    assert list(table["steps (warmup)"].unique()) == ["49 (20)"] and table["tokens/param"].iloc[0] == "1.87"


def test_the_document_says_what_the_ladder_cannot_conclude_with_its_figures():
    runs = runs_of({"standard": clean, "attnres": bending, "flat": flat}, worth={"attnres": 1.25})
    found, checks = checked(runs, bootstrap=50)
    text = scaling_doc.document(runs, found, "standard", "lad", {}, bootstrap=50)
    said = text.split("### What this ladder cannot conclude", 1)[1]
    bent = checks["attnres"]
    assert (f"**attnres**: the law does not describe this ladder. Its size means miss the fitted curve by "
            f"{bent.miss:.3g} nats (RMS) where the seeds' own spread is σ = {bent.sigma:.3g} (lack of fit F = "
            f"{bent.lof_f:.3g} on 3 and 12 df") in said
    assert ("**flat**: the loss does not fall with compute across the ladder (3.150 at s0, 3.150 at s5; +0 nats a "
            f"decade of compute, one-sided p = 0.5 ≥ {scaling_checks.LEVEL:g})") in said
    assert "**standard**" not in said  # a law that passes says nothing here


def test_a_ladders_runs_carry_what_they_trained_on():
    frame = pd.DataFrame([{"id": 1, "variant": "standard", "seed": 1, "status": "finished",
                           "config_json": json.dumps({"model": {"d_model": 32, "n_layer": 2}, "train": {}})}])
    last = {1: {"eval_loss": 3.0, "train_flops": 1e12}}
    runs = scaling.ladder_runs(frame, last, budget_of={1: {"steps": 49, "warmup": 20, "tokens": 50_176,
                                                           "params": 26_784}})
    assert runs.iloc[0][["steps", "warmup", "tokens", "params"]].tolist() == [49, 20, 50_176, 26_784]
    assert math.isnan(scaling.ladder_runs(frame, last).iloc[0]["steps"])  # none given: unknown, nothing flagged


def test_the_bench_draws_each_kind_as_defined():
    rng = np.random.default_rng(7)
    for kind in bench_scaling.KINDS:
        runs = bench_scaling.synthetic_ladder(kind, rng)
        assert set(runs["variant"]) == {"standard", "attnres"} and 4 <= runs["size"].nunique() <= 6
        per_size = runs.groupby(["variant", "size"]).size()
        assert per_size.min() == per_size.max() and 2 <= per_size.min() <= 3
        span = np.log10(runs["compute"].max() / runs["compute"].min())
        assert 1.4 <= span <= 2.1
    out = bench_scaling.bench_scaling(draws=2, bootstrap=20)
    for kind in bench_scaling.KINDS:
        assert out[f"{kind}: ladders"] == 2 and 0 <= out[f"{kind}: flag rate"] <= 1
    assert 0 <= out["true law: multiplier coverage, the ladder's sizes"] <= 1


def test_bench_scaling_prints_its_measures(workdir):
    out = json.loads(cli_here("bench", "scaling", "--draws", "1", "--json", check=True).stdout)
    assert out["bending: ladders"] == 1 and "true law: multiplier coverage, the largest size" in out
