"""The benchmark commands run and report their measures (figures are not asserted: no timing tests)."""

from __future__ import annotations

import json

from conftest import attnres


def test_bench_data_reports_prepare_next_to_tiktoken(workdir):
    out = json.loads(attnres("bench", "data", "--megabytes", "0.5", "--json", check=True).stdout)
    assert out["megabytes"] >= 0.5 and out["tokens"] > 100_000
    assert out["prepare_mb_s"] > 0 and out["tiktoken_mb_s"] > 0
    assert abs(out["ratio"] - out["prepare_mb_s"] / out["tiktoken_mb_s"]) < 1e-9


def test_bench_report_builds_a_report_over_a_synthetic_database(workdir):
    out = json.loads(attnres("bench", "report", "--runs", "6", "--steps", "300", "--json", check=True).stdout)
    assert out["metric_rows"] == 6 * 300 * 5
    assert out["report_s"] > 0 and out["report_with_plots_s"] > 0


def test_unknown_benchmark_is_one_clear_line(workdir):
    proc = attnres("bench", "nosuch")
    assert proc.returncode == 2 and "unknown benchmark 'nosuch'" in proc.stderr
