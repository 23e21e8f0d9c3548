"""Labels that say no more than the data show (issue 45, section 5): the Results header names the table's step, a
figure with nothing to show is left out with a sentence, the throughput axis' unit matches its values, and the
scaling legend writes a fitted parameter as the fit table does."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from helpers import cli_here

from attnres.reports import scaling
from attnres.reports.document import assemble
from attnres.reports.numbers import throughput_unit
from attnres.reports.plots import delta_curves, no_delta, no_throughput, plt, throughput_vs_delta
from attnres.reports.tables import completed


def _table(tokens_per_s: tuple[float, float] = (92.0, 86.0)) -> pd.DataFrame:
    """A per_variant-shaped table: standard and control_block, two seeds each."""
    return pd.DataFrame([
        {"variant": "standard", "eval": 4.05, "std": 0.07, "values": {1: 4.0, 2: 4.1}, "run_ids": {1: 1, 2: 2},
         "train": 4.2, "seeds": [1, 2], "tokens_per_s": tokens_per_s[0], "peak_memory_bytes": math.nan, "mark": ""},
        {"variant": "control_block", "eval": 3.95, "std": 0.07, "values": {1: 3.9, 2: 4.0}, "run_ids": {1: 3, 2: 4},
         "train": 4.1, "seeds": [1, 2], "tokens_per_s": tokens_per_s[1], "peak_memory_bytes": math.nan, "mark": ""},
    ])


def test_the_train_loss_header_names_the_tables_step_not_a_run_still_behind():
    out = completed(_table(), "standard", behind=[("control_block", 3, 5), ("standard", 4, 17)], step=2000)
    assert "Train Loss @ 2,000" in out.columns and not any("@ 5" in c or "@ 17" in c for c in out.columns)
    seeds = dict(zip(out["Variant"], out["Seeds"], strict=True))
    assert "s3 in progress, step 5" in seeds["control_block"] and "s4 in progress, step 17" in seeds["standard"]
    assert "Train Loss (final)" in completed(_table(), "standard", behind=[("standard", 4, 17)]).columns


def _runs_evals(variant_steps: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = pd.DataFrame({"id": [1, 2, 3, 4], "variant": ["standard"] * 2 + ["control_block"] * 2,
                         "seed": [1, 2, 1, 2], "status": ["finished"] * 2 + ["running"] * 2})
    rows = [(rid, st, 5.0 - st / 100) for rid in (1, 2) for st in (50, 100)]
    rows += [(rid, st, 6.0 - st / 100 + rid / 50) for rid in (3, 4) for st in variant_steps]
    return runs, pd.DataFrame(rows, columns=["run_id", "step", "value"])


def test_a_delta_figure_with_nothing_to_show_is_left_out_with_a_sentence():
    runs, evals = _runs_evals([25])  # the variant is behind: no step the baseline has
    assert delta_curves(runs, evals, "standard") is None
    why = no_delta(runs, "standard")
    assert "no variant has an eval loss yet at a step where standard has one" in why
    assert "only the baseline" in no_delta(runs[runs["variant"] == "standard"], "standard")
    text = assemble(["# doc\n"], {why: None, "Other": "r_figures/other.png"}, [])
    assert f"_{why}_" in text and "![Other](r_figures/other.png)" in text and text.count("![") == 1
    # one shared step: drawn, as a point (a line of one point would show nothing)
    fig = delta_curves(*_runs_evals([25, 50]), "standard")
    try:
        line = next(ln for ln in fig.axes[0].get_lines() if "control_block" in ln.get_label())
        assert list(line.get_xdata()) == [50] and line.get_marker() == "o"
    finally:
        plt.close(fig)


def test_a_partial_report_writes_no_empty_delta_figure(workdir):
    rows = [("standard", s, st, 5.0 - st / 100 + s / 50, "finished") for s in (1, 2) for st in (50, 100)]
    rows += [("control_block", s, 25, 6.0 + s / 50, "running") for s in (1, 2)]
    pd.DataFrame(rows, columns=["variant", "seed", "step", "value", "status"]).assign(
        key="eval_loss", total_steps=100).to_csv(workdir / "a.csv", index=False)
    cli_here("import", workdir / "a.csv", check=True)
    cli_here("report", "--out", "r.md", check=True)
    text = (workdir / "r.md").read_text()
    figures = text.split("## Figures")[1].split("\n## ")[0]
    assert "![" not in figures and "No Δ figure: no variant has an eval loss yet" in figures, figures
    assert "No throughput figure" in figures
    assert not (workdir / "r_figures" / "delta_curves.png").exists()
    assert not (workdir / "r_figures" / "throughput_vs_delta.png").exists()


def test_the_throughput_axis_unit_matches_its_values():
    assert throughput_unit([92.0, 86.0]) == (1.0, "tok/s")
    assert throughput_unit([459e3, 999.0]) == (1000.0, "k tok/s")
    assert math.isnan(throughput_unit([math.nan, None])[0])
    for tps, unit, xs in (((92.0, 86.0), "tok/s", {92.0, 86.0}), ((459e3, 197e3), "k tok/s", {459.0, 197.0})):
        fig = throughput_vs_delta(_table(tps), "standard")
        try:
            ax = fig.axes[0]
            assert ax.get_xlabel() == f"throughput ({unit})"
            assert {float(ln.get_xdata()[0]) for ln in ax.get_lines() if ln.get_marker() in ("o", "s")} == xs
        finally:
            plt.close(fig)
    # only the baseline has a throughput: nothing to set against it
    assert throughput_vs_delta(_table((92.0, math.nan)), "standard") is None
    assert "no variant compared with standard at step 2,000" in no_throughput("standard", 2000)


def test_the_scaling_legend_writes_the_fit_as_the_table_does():
    runs = pd.DataFrame({"variant": ["standard"] * 4, "compute": np.geomspace(1e12, 1e15, 4),
                         "loss": [4.0, 3.5, 3.1, 2.8]})
    for e, shown in ((8.24e-18, "0"), (1.23456789, "1.235")):  # at its bound 0, and a floor the fit found
        fit = scaling.Fit("standard", points=4, sizes=4, e=e, a=123.456789, alpha=0.0712345)
        row = scaling.fit_table({"standard": fit}).iloc[0]
        fig = scaling.figure(runs, {"standard": fit})
        try:
            labels = fig.axes[0].get_legend_handles_labels()[1]
        finally:
            plt.close(fig)
        law = next(label for label in labels if label.startswith("standard:"))
        assert row["E"] == shown and law == f"standard: E={row['E']}, α={row['α']}", (law, row.to_dict())
        assert "e-" not in law
