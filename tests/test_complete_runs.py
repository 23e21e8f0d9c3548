"""A finished run is a complete run: kill and resume issued together, over and over, never leave two writers on
one spool, and the run's curve has no hole."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers import CLI, FAST, INLINE, LONG, cli_here, runs, train_steps, wait_for

pytestmark = pytest.mark.integration

# kill and resume issued together this many times (ATTNRES_TEST_TRIALS=20 for the long form: 0 holes in 20 too)
TRIALS = int(os.environ.get("ATTNRES_TEST_TRIALS", "4"))


def cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_kill_and_resume_together_leave_no_hole(workdir, monkeypatch):
    monkeypatch.setenv("ATTNRES_KILL_GRACE", "5")
    cli_here("launch", "standard", "--seeds", "1", "--steps", LONG, *FAST, "--detach", check=True)
    db = workdir / "runs.db"
    outcomes = {"resumed after the kill": 0, "resume refused (still running)": 0}
    for trial in range(TRIALS):
        if trial % 5 == 0:  # now and then it trains between the trials; else the pair meets a run just started
            at = max(train_steps(db), default=0)
            wait_for(lambda at=at: max(train_steps(db), default=0) >= at + 4)
        kill, resume = cli("kill", "1"), cli("resume", "1", "--detach")
        assert kill.wait(timeout=120) == 0, kill.stderr.read()
        code = resume.wait(timeout=120)
        if code == 0:
            outcomes["resumed after the kill"] += 1
        else:  # it came first and found the run running: one line, nothing changed
            assert "is running" in (why := resume.stderr.read()) or "is queued" in why, why
            outcomes["resume refused (still running)"] += 1
            assert runs(workdir)[0]["status"] == "killed"
            cli_here("resume", "1", "--detach", check=True)
    wait_for(lambda: runs(workdir)[0]["status"] == "running" and runs(workdir)[0]["pid"])
    cli_here("kill", "1", check=True)
    steps = train_steps(db)
    assert steps == sorted(set(steps)) and steps == list(range(2, steps[-1] + 1, 2)), "holes in the curve"
    assert steps[-1] >= 4
    print("KILL-RESUME", TRIALS, "trials:", outcomes, "steps", steps[-1])


def test_a_finished_run_missing_rows_is_incomplete_until_resume_retrains_them(workdir):
    import sqlite3

    cli_here("launch", "standard", "--seeds", "1", "--steps", "30", *FAST, *INLINE, check=True)
    db = workdir / "runs.db"
    assert runs(workdir)[0]["status"] == "finished"
    with sqlite3.connect(db) as conn:  # rows lost as a lost spool with its trainer loses them
        conn.execute("delete from metrics where run_id = 1 and step between 13 and 17 and key_id = "
                     "(select id from metric_keys where name = 'train_loss')")
    shown = cli_here("status", check=True).stdout  # it only reads: the holes shown, the run as recorded
    assert "rows missing" in shown and "run 1 is recorded finished, but the database lacks train_loss steps 14-16" \
        in shown and runs(workdir)[0]["status"] == "finished"
    assert "run 1 recorded incomplete" in cli_here("sync", check=True).stdout
    assert runs(workdir)[0]["status"] == "incomplete" and "train_loss steps 14-16" in runs(workdir)[0]["message"]
    report = cli_here("report", "--out", "r.md", "--no-plots")
    assert report.returncode in (0, 2)  # its curve is not used as complete: marked, or nothing to compare
    out = cli_here("resume", "1", check=True).stdout
    assert "retraining the steps it lacks from step 14" in out, out
    assert runs(workdir)[0]["status"] == "finished"
    assert train_steps(db) == list(range(2, 31, 2)) + ([] if 30 % 2 == 0 else [30])
