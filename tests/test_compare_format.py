"""`attnres compare` writes numbers as the report does (issue 28, item 7): steps and counts as integers, a value
that is not there as '—', memory in GiB, throughput as '197k tok/s', and a loss the same in both documents."""

from __future__ import annotations

import math
import re

import pytest
from helpers import arms_csv, cli_here, in_process
from seed_scenario import FINAL
from seed_scenario import rows as seed_rows

from attnres.reports import numbers

NAN = re.compile(r"\bnan\b", re.IGNORECASE)


def table(text: str, heading: str = "") -> list[dict[str, str]]:
    """The first markdown table after ``heading`` (or in ``text``): one dict per row, header -> cell."""
    part = text.split(heading, 1)[1] if heading else text
    lines = []
    for ln in part.splitlines():
        if not ln.startswith("|"):
            if lines:
                break
            continue
        lines.append([c.strip() for c in ln.strip().strip("|").split("|")])
    header, body = lines[0], lines[2:]
    return [dict(zip(header, row, strict=True)) for row in body]


@pytest.fixture
def seed_db(workdir, capsys, monkeypatch):
    """The seed scenario (tests/seed_scenario.py) imported into the test's database."""
    seed_rows().to_csv(workdir / "seed.csv", index=False)
    code, _, err = in_process(["import", workdir / "seed.csv"], capsys, monkeypatch)
    assert code == 0, err
    return workdir


def test_compare_markdown_has_integer_steps_and_counts_dashes_and_gib(seed_db, capsys, monkeypatch):
    code, _, err = in_process(["compare", "standard", "block_hybrid_memory", "--out", "c.md"], capsys, monkeypatch)
    assert code == 0, err
    text = (seed_db / "c.md").read_text()
    assert not NAN.search(text), "a value that is not there is written as '—', never nan"
    assert ".0000" not in text
    # steps: whole numbers, as the report writes them
    aligned = table(text, "## Eval loss at common steps")
    assert [r["step"] for r in aligned] == [f"{s:,}" for s in range(500, 6001, 500)]
    assert "## Statistics over seeds at step 6,000" in text
    # counts: seeds, pairs, seeds needed
    every = {r["variant"]: r for r in table(text, "### Every figure")}
    hybrid, standard = every["block_hybrid_memory"], every["standard"]
    assert (standard["seeds"], hybrid["seeds"]) == ("1", "4")
    assert re.fullmatch(r"\d+", hybrid["seeds_needed"]) and re.fullmatch(r"\d+", hybrid["seeds_at_observed_sd"])
    assert re.fullmatch(r"\d+", hybrid["paired_n"])
    assert standard["seeds_needed"] == "—" and standard["p"] == "—" and standard["std"] == "—"  # the first arm
    summary = {r["arm"]: r for r in table(text, "## Statistics over seeds")}
    assert summary["block_hybrid_memory"]["seeds"] == "4"
    assert summary["block_hybrid_memory"]["seeds per arm to resolve"].startswith(f"~{hybrid['seeds_needed']} ")
    # memory in GiB (bytes / 2**30, to the precision shown), throughput as the report writes it
    cost = {r["variant"]: r for r in table(text, "## Throughput and memory")}
    for variant in ("standard", "block_hybrid_memory"):
        _, tps, mem = FINAL[variant]
        cell = cost[variant]["peak memory"]
        shown = re.fullmatch(r"(\d+\.(\d+)) GiB", cell)
        assert shown, cell
        assert abs(float(shown[1]) - mem / 2**30) <= 0.5 * 10 ** -len(shown[2]), (cell, mem)
        assert cost[variant]["mean tok/s"] == f"{tps / 1000:.0f}k tok/s"
    assert cost["block_hybrid_memory"]["memory vs first"] == f"{(120 / 49 - 1) * 100:+.0f}%"
    assert "120000000000" not in text and "120,000,000,000" not in text


def test_a_loss_is_printed_the_same_in_the_report_and_in_compare(seed_db, capsys, monkeypatch):
    code, _, err = in_process(["report", "--out", "r.md", "--no-plots"], capsys, monkeypatch)
    assert code == 0, err
    code, _, err = in_process(["compare", "standard", "block_hybrid_memory", "--out", "c.md"], capsys, monkeypatch)
    assert code == 0, err
    report, compare = (seed_db / "r.md").read_text(), (seed_db / "c.md").read_text()
    results = {r["Variant"]: r for r in table(report, "## Results")}
    summary = {r["arm"]: r for r in table(compare, "## Statistics over seeds")}
    every = {r["variant"]: r for r in table(compare, "### Every figure")}
    aligned = table(compare, "## Eval loss at common steps")[-1]  # step 6,000, the report's step
    # hybrid's mean ± std over its 4 seeds: '2.691 ± 0.006 (mean of 4)' in the report
    mean_std = results["block_hybrid_memory"]["Eval Loss"].removesuffix(" (mean of 4)")
    assert summary["block_hybrid_memory"]["eval loss"] == mean_std
    mean = mean_std.split(" ± ")[0]
    assert every["block_hybrid_memory"]["mean"] == mean == aligned["block_hybrid_memory"]
    # standard's one seed: '2.716 (seed 42)'
    one = results["standard"]["Eval Loss"].removesuffix(" (seed 42)")
    assert summary["standard"]["eval loss"] == one == every["standard"]["mean"] == aligned["standard"]
    # Δ against standard, the report's baseline and compare's first arm
    d = results["block_hybrid_memory"]["Δ vs Baseline"]
    assert summary["block_hybrid_memory"]["Δ"] == d == every["block_hybrid_memory"]["delta"]
    # the std alone as the report's Multi-Seed Std row writes it
    multi = {r["Seed"]: r for r in table(report.split("### block_hybrid_memory")[1])}
    assert every["block_hybrid_memory"]["std"] == multi["Std"]["Eval Loss @ 6000"]
    # throughput: the report's Throughput cell
    cost = {r["variant"]: r for r in table(compare, "## Throughput and memory")}
    assert cost["block_hybrid_memory"]["mean tok/s"] == results["block_hybrid_memory"]["mean tok/s"]


def test_compare_on_the_terminal_writes_numbers_as_the_markdown_does(seed_db, capsys, monkeypatch):
    proc = cli_here("compare", "block_hybrid_memory", "standard", columns=250)  # (the whole table on one line a row)
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, err
    assert not NAN.search(out)
    for raw in ("49,000,000,000", "120,000,000,000", "459,000.0", "197,000.0", "6000.0", "32.0000"):
        assert raw not in out, raw
    assert "45.63 GiB" in out and "111.76 GiB" in out and "459k tok/s" in out and "197k tok/s" in out
    assert re.search(r"│\s+6,000 │\s+2\.691 │\s+2\.716 │\s+\+0\.0\d\d │", out), out
    assert re.search(r"│ standard\s+│ 459k tok/s │\s+45\.63 GiB │\s+\+133% \(one run of standard: spread unknown\)"
                     r"\s+│\s+-59% │", out), out


def test_paired_arms_and_unmeasured_costs(workdir, capsys, monkeypatch):
    """Arms on the same seeds: a paired test, its p-values and interval written as the report writes them;
    throughput and memory never recorded: '—'."""
    csv = arms_csv(workdir, {"standard": {1: 3.00, 2: 3.10, 3: 2.95}, "control_block": {1: 2.93, 2: 3.05, 3: 2.86}})
    assert in_process(["import", csv], capsys, monkeypatch)[0] == 0
    code, out, err = in_process(["compare", "standard", "control_block", "--out", "c.md"], capsys, monkeypatch)
    assert code == 0, err
    text = (workdir / "c.md").read_text()
    assert not NAN.search(text) and not NAN.search(out)
    arm = {r["arm"]: r for r in table(text, "## Statistics over seeds")}["control_block"]
    assert arm["test"] == "paired (3 pairs)"
    for p in (arm["p"], arm["Holm p"]):
        assert float(p) > 0 and p == format(float(p), ".3g")
    assert re.fullmatch(r"\[[+-]\d\.\d{3}, [+-]\d\.\d{3}\] \(95%\)", arm["Δ interval"]), arm["Δ interval"]
    every = {r["variant"]: r for r in table(text, "### Every figure")}["control_block"]
    assert every["paired_n"] == "3" and re.fullmatch(r"-?\d+\.\d{4}", every["paired_t"])
    assert every["delta_low"] == arm["Δ interval"][1:7]
    cost = {r["variant"]: r for r in table(text, "## Throughput and memory")}["control_block"]
    assert cost["mean tok/s"] == cost["peak memory"] == cost["tok/s vs first"] == cost["memory vs first"] == "—"
    assert [r["step"] for r in table(text, "## Eval loss at common steps")] == ["0", "50", "100"]


def test_the_number_helpers():
    assert numbers.count(6000.0) == "6,000" and numbers.count(3.0) == "3"
    assert numbers.count(math.nan) == numbers.count(None) == "—" and numbers.count(math.inf) == "> 100,000"
    assert numbers.gib(89.6e9) == "83.45 GiB" and numbers.gib(math.nan) == "—"
    assert numbers.loss(2.69049) == "2.690" and numbers.loss(math.nan) == "—"
    assert numbers.delta(-0.0004) == "+0.000" and numbers.delta(-0.0256) == "-0.026"
    assert numbers.p_value(0.012345) == "0.0123" and numbers.p_value(None) == "—"
    assert numbers.throughput_text(197e3) == "197k tok/s"
    assert numbers.text("") == numbers.text(None) == numbers.text(math.nan) == "—"
