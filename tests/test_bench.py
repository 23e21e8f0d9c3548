"""The benchmark commands run and report their measures (figures are not asserted: no timing tests)."""

from __future__ import annotations

import json

import pytest
from helpers import cli_here

from attnres.model import cpu_kernel

pytestmark = pytest.mark.integration


def test_bench_data_reports_prepare_next_to_tiktoken(workdir):
    out = json.loads(cli_here("bench", "data", "--megabytes", "0.5", "--json", check=True).stdout)
    assert out["megabytes"] >= 0.5 and out["tokens"] > 100_000
    assert out["prepare_mb_s"] > 0 and out["tiktoken_mb_s"] > 0
    assert abs(out["ratio"] - out["prepare_mb_s"] / out["tiktoken_mb_s"]) < 1e-9


def test_bench_report_builds_a_report_over_a_synthetic_database(workdir):
    out = json.loads(cli_here("bench", "report", "--runs", "6", "--steps", "300", "--json", check=True).stdout)
    assert out["metric_rows"] == 6 * (300 * 5 + 1)  # and each run's eval at step 0
    assert out["report_s"] > 0 and out["report_with_plots_s"] > 0


def test_unknown_benchmark_is_one_clear_line(workdir):
    proc = cli_here("bench", "nosuch")
    assert proc.returncode == 2 and "unknown variant 'nosuch'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["control_block", "--steps", "0"], "--steps must be at least 1"),
    (["control_block", "--device", "tpu"], "--device tpu: choose cpu"),
    (["report", "--steps", "0"], "--runs and --steps must be at least 1"),
])
def test_bad_bench_settings_are_one_clear_line(workdir, args, message):
    proc = cli_here("bench", *args, "--preset", "tiny")
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


TINY = ["--set", "vocab_size=97", "--set", "d_model=32", "--set", "n_head=2", "--set", "seq_len=16",
        "--set", "batch_size=2"]


def test_bench_races_variants_against_standard_in_one_process(workdir):
    out = json.loads(cli_here("bench", "control_block", "full_attnres", "--preset", "tiny", *TINY,
                             "--steps", "2", "--warmup", "0", "--json", check=True).stdout)
    assert [r["variant"] for r in out] == ["standard", "control_block", "full_attnres"]
    base = out[0]
    assert base["speed_ratio"] == 1.0 and base["saved_ratio"] == 1.0
    for r in out:
        assert r["tokens_per_step"] == 2 * 16 and r["tokens_per_s"] > 0 and r["step_ms"] > 0
        assert r["peak_memory_bytes"] is None  # CPU: no allocator peak to read
        if cpu_kernel._compiler() is not None:  # the fused C kernel builds and is what was measured
            assert r["depth_kernel"] == "c"
        assert abs(r["saved_ratio"] - r["saved_bytes_per_token"] / base["saved_bytes_per_token"]) < 1e-9
    cb = out[1]
    assert cb["speed_target"] == 0.96 and cb["saved_target"] == 1.10
    assert cb["meets_targets"] == (cb["speed_ratio"] >= 0.96 and cb["saved_ratio"] <= 1.10)


def test_bench_table_names_every_column(workdir):
    proc = cli_here("bench", "block_mqa_depth", "--preset", "tiny", *TINY, "--steps", "1", "--warmup", "0",
                   check=True)
    assert "block_mqa_depth" in proc.stdout and "saved" in proc.stdout and "standard" in proc.stdout
