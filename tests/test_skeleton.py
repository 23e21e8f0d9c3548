"""End to end: the installed command launches real torchrun trainers that record runs in a real SQLite file (the
verbs around them are called in the test's process: their output, not their interpreter, is the subject)."""

from __future__ import annotations

import sqlite3

import pytest
from helpers import FAST, FAST_GPT2, INLINE, attnres, cli_here

pytestmark = pytest.mark.integration


def eval_curve(db: str, run_id: int) -> list[tuple[int, float]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "select m.step, m.value from metrics m join metric_keys k on k.id = m.key_id "
            "where k.name = 'eval_loss' and m.run_id = ? order by m.step", (run_id,)).fetchall()


def test_launch_two_seeds_records_finished_runs_whose_eval_loss_fell(workdir):
    proc = attnres("launch", "standard", "--seeds", "42", "1337", "--steps", "20", *FAST_GPT2, "--set", "lr=1e-2",
                   check=True)
    assert "run 1: finished" in proc.stdout and "run 2: finished" in proc.stdout
    db = str(workdir / "runs.db")
    with sqlite3.connect(db) as conn:
        runs = conn.execute("select id, variant, seed, status, step, total_steps, pid, host, experiment, device "
                            "from runs").fetchall()
        mode = conn.execute("pragma journal_mode").fetchone()[0]
    assert mode == "wal"
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in runs] == [
        ("standard", 42, "finished", 20, 20), ("standard", 1337, "finished", 20, 20)]
    assert all(r[6] and r[7] for r in runs)
    assert [(r[8], r[9]) for r in runs] == [("tiny", "cpu x 1")] * 2  # the preset's experiment; what trained it
    for run_id in (1, 2):
        curve = eval_curve(db, run_id)
        assert [s for s, _ in curve] == [0, 10, 20]
        assert curve[-1][1] < curve[0][1] - 1.0  # from ~10.8 (uniform over 50k tokens) down
    # the two seeds saw different batches, so their curves differ
    assert eval_curve(db, 1)[-1][1] != eval_curve(db, 2)[-1][1]
    assert (workdir / "logs" / "run-1.log").exists()

    status = cli_here("status", check=True).stdout
    assert "standard" in status and "finished" in status and "20/20" in status

    report = cli_here("report", "--out", "results.md", check=True)
    text = (workdir / "results.md").read_text()
    assert "wrote results.md" in report.stdout
    assert "| standard" in text and "2 seeds (42, 1337)" in text and "at step 20, the final step" in text


def test_ddp_run_with_two_gloo_ranks(workdir):
    attnres("launch", "standard", "--seeds", "7", "--nproc", "2", "--steps", "6", *FAST, check=True)
    with sqlite3.connect(workdir / "runs.db") as conn:
        status, world = conn.execute("select status, world_size from runs").fetchone()
    assert (status, world) == ("finished", 2)


def test_dry_run_prints_the_torchrun_command_and_records_nothing(workdir):
    out = cli_here("launch", "control_block", "--seeds", "1", "--dry-run", check=True).stdout
    assert ("-m attnres.runs.torchrun --standalone --nproc_per_node=1 --start-method fork -m attnres.train -- --run-id"
            in out)
    assert not (workdir / "runs.db").exists()


def test_unknown_variant_is_one_clear_line(workdir):
    proc = cli_here("launch", "nosuchvariant", "--seeds", "1")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown variant 'nosuchvariant'" in lines[0]
    assert "Traceback" not in proc.stderr
    near = cli_here("launch", "block_gqa_dept", "--seeds", "1")
    assert near.returncode == 2 and "did you mean 'block_gqa_depth'?" in near.stderr


def test_finished_config_is_skipped_unless_forced(workdir):
    cli_here("launch", "standard", "--seeds", "3", "--steps", "2", *FAST, *INLINE, check=True)
    again = cli_here("launch", "standard", "--seeds", "3", "--steps", "2", *FAST, *INLINE, check=True)
    assert "skip" in again.stdout
    with sqlite3.connect(workdir / "runs.db") as conn:
        assert conn.execute("select count(*) from runs").fetchone()[0] == 1
