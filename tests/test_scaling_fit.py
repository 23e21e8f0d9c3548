"""The scaling-law fit (issue 29, first part): known E, A and α are recovered within their bootstrap
intervals, a variant worth 1.25× the baseline's compute is measured as such, and too few sizes give no number."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnres.reports import scaling, scaling_doc

E, ALPHA = 2.0, 0.3
A = 2.0 * 1e12**ALPHA  # the reducible loss is 2.0 at the smallest compute


def ladder(variant: str, worth: float = 1.0, sizes: int = 6, seeds: int = 5, noise: float = 0.01,
           rng: np.random.Generator | None = None) -> pd.DataFrame:
    """Runs of a synthetic ladder: each seed's loss the law at ``worth`` times its compute, plus noise."""
    rng = rng or np.random.default_rng(0)
    rows = []
    for size, compute in enumerate(np.geomspace(1e12, 1e15, sizes)):
        for seed in range(seeds):
            loss = scaling.law(np.array(compute * worth), E, A, ALPHA) + rng.normal(0, noise)
            rows.append({"variant": variant, "seed": seed, "size": f"s{size}", "compute": compute,
                         "loss": float(loss)})
    return pd.DataFrame(rows)


def test_known_parameters_are_recovered_within_their_intervals():
    runs = ladder("standard")
    fit = scaling.fit_variant(runs, "standard", bootstrap=200)
    assert fit.ok and fit.sizes == 6 and fit.points == 30
    for name, true in (("e", E), ("a", A), ("alpha", ALPHA)):
        lo, hi = fit.intervals[name]
        assert lo <= true <= hi, (name, true, lo, hi)
    assert abs(fit.e - E) < 0.1 and abs(fit.alpha - ALPHA) < 0.05


def test_a_variant_worth_more_compute_gets_its_multiplier():
    rng = np.random.default_rng(1)
    runs = pd.concat([ladder("standard", rng=rng), ladder("attnres", worth=1.25, rng=rng)])
    found = scaling.fits(runs, bootstrap=200)
    value, ci = scaling.multiplier(found["attnres"], found["standard"], 1e14)
    assert ci is not None and ci[0] <= 1.25 <= ci[1] and abs(value - 1.25) < 0.15, (value, ci)
    table = scaling_doc.multiplier_table(runs, found, "standard")
    assert list(table["variant"]) == ["attnres"] and "10× largest (extrapolated)" in table.columns


def test_too_few_sizes_say_so_and_give_no_number():
    runs = ladder("standard", sizes=3)
    fit = scaling.fit_variant(runs, "standard", bootstrap=50)
    assert not fit.ok and "too few points" in fit.reason
    row = scaling.fit_table({"standard": fit}).iloc[0]
    assert row["E"] == "—" and row["α"] == "—" and "too few points" in row["note"]


def test_training_flops_count_the_depth_attention_by_its_sources():
    from attnres.model import flops
    from attnres.variants.registry import resolve_run

    std = resolve_run("standard", "tiny", 1)
    full = resolve_run("full_attnres", "tiny", 1)
    assert flops.depth_flops_per_token(std.model) == 0
    assert flops.depth_flops_per_token(full.model) > 0  # its sources grow with depth
    params = 10_000
    base = flops.training_flops(std, params)
    # 6·N·tokens, plus the head and causal attention: never below the convention's 6·N·D
    assert base >= 6 * params * flops.tokens_per_step(std) * std.train.steps
    assert flops.training_flops(full, params) > flops.training_flops(
        resolve_run("full_attnres", "tiny", 1, ["n_layer=1"]), params)


def test_a_fit_at_its_bound_or_outside_its_interval_says_so():
    runs = ladder("standard", seeds=2)
    fit = scaling.fit_variant(runs, "standard", bootstrap=50)
    at_zero = scaling.Fit("v", 8, 4, e=0.0, a=fit.a, alpha=fit.alpha, intervals=dict(fit.intervals))
    row = scaling.fit_table({"v": at_zero}).iloc[0]
    assert row["E"] == "0" and "E at its bound 0" in row["note"]
    moved = scaling.Fit("v", 8, 4, e=fit.intervals["e"][1] + 1, a=fit.a, alpha=fit.alpha, intervals=dict(fit.intervals))
    assert "E outside its bootstrap interval" in scaling.fit_table({"v": moved}).iloc[0]["note"]
    assert scaling.fit_table({"v": fit}).iloc[0]["note"] == ""  # a good fit says nothing more
