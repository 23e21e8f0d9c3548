"""The queue with real processes: ordering, crashes, resume, preemption, early stop, kill."""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import psutil
from conftest import FAST, attnres

from attnres.listing import grid_rows
from attnres.tracking.db import get_engine


def runs(workdir) -> list[dict]:
    with sqlite3.connect(workdir / "runs.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("select * from runs order by id")]


def curve(workdir, run_id: int, key: str) -> dict[int, float]:
    with sqlite3.connect(workdir / "runs.db") as conn:
        return dict(conn.execute("select m.step, m.value from metrics m join metric_keys k on k.id = m.key_id "
                                 "where k.name = ? and m.run_id = ?", (key, run_id)).fetchall())


def wait_for(predicate, timeout: float = 120, every: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("timed out waiting")


def test_detached_queue_runs_cpu_jobs_one_after_the_other(workdir):
    out = attnres("launch", "standard", "control_block", "--seeds", "1", "--steps", "6", *FAST, "--detach",
                  check=True).stdout
    assert "queue running in the background" in out
    assert [r["status"] for r in runs(workdir)] in (["queued", "queued"], ["running", "queued"])
    wait_for(lambda: all(r["status"] == "finished" for r in runs(workdir)))
    first, second = runs(workdir)
    assert second["started_at"] >= first["ended_at"]
    logs = attnres("logs", "1", check=True).stdout
    assert "step 6/6" in logs
    header, rows = grid_rows(get_engine(str(workdir / "runs.db")))
    assert header == ["variant", "seed 1"] and rows[0][1].startswith("finished 6/6")


def test_sigkill_of_a_trainer_is_failed_within_30s_and_the_queue_goes_on(workdir):
    attnres("launch", "standard", "--seeds", "1", "2", "--steps", "400", *FAST, "--detach", check=True)
    pid = wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["step"] >= 2 and r["pid"])
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: runs(workdir)[0]["status"] == "failed", timeout=30)
    assert time.monotonic() - killed_at < 30
    first = runs(workdir)[0]
    assert first["exit_code"] != 0 and "exited with code" in first["message"]
    wait_for(lambda: runs(workdir)[1]["status"] == "running")  # the next run starts
    status = attnres("status", check=True).stdout
    assert "failed" in status
    attnres("kill", "--all", check=True)
    assert runs(workdir)[1]["status"] == "killed"


def test_resume_after_sigkill_reproduces_the_uninterrupted_losses_exactly(workdir):
    args = ["--steps", "36", *FAST, "--set", "checkpoint_every=4", "--set", "log_every=1"]
    attnres("launch", "standard", "--seeds", "11", *args, check=True)
    attnres("launch", "standard", "--seeds", "11", *args, "--force", "--detach", check=True)
    pid = wait_for(lambda: (r := runs(workdir)[1])["status"] == "running" and 6 <= r["step"] < 30 and r["pid"])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: runs(workdir)[1]["status"] == "failed")
    interrupted_at = runs(workdir)[1]["step"]
    assert interrupted_at < 36
    out = attnres("resume", "2", check=True).stdout
    assert "run 2: finished" in out
    for key in ("train_loss", "eval_loss"):
        a, b = curve(workdir, 1, key), curve(workdir, 2, key)
        assert a.keys() == b.keys() and a == b  # bit-identical at every step, before and after the kill


def test_sigterm_preempts_with_a_checkpoint_and_relaunching_the_grid_resumes(workdir):
    args = ["--steps", "400", *FAST, "--set", "checkpoint_every=1000"]
    attnres("launch", "standard", "--seeds", "3", *args, "--detach", check=True)
    run = wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["step"] >= 3 and r)
    os.kill(run["agent_pid"], signal.SIGTERM)  # as a scheduler's preemption does: torchrun forwards it
    wait_for(lambda: runs(workdir)[0]["status"] == "preempted")
    stopped = runs(workdir)[0]["step"]
    assert (workdir / "checkpoints" / "run-1" / "last.pt").exists()
    again = attnres("launch", "standard", "--seeds", "3", *args, "--set", "steps=400", "--detach", check=True)
    assert "resume run 1" in again.stdout
    wait_for(lambda: runs(workdir)[0]["step"] > stopped)
    attnres("kill", "1", check=True)
    assert len(runs(workdir)) == 1


def test_early_stop_rule_stops_a_run_worse_than_the_baseline(workdir):
    attnres("launch", "standard", "--seeds", "1", "--steps", "10", *FAST, check=True)
    # a learning rate of ~0 keeps full_attnres at its initial loss, far worse than standard at step 10
    proc = attnres("launch", "full_attnres", "--seeds", "1", "--steps", "12", *FAST, "--set", "lr=1e-9",
                   "--kill-if-worse-than", "standard", "--by", "0.1", "--at-step", "10")
    assert proc.returncode == 1 and "run 2: stopped" in proc.stdout
    r = runs(workdir)[1]
    assert (r["status"], r["stop_step"], r["step"]) == ("stopped", 10, 10)
    assert "worse than standard" in r["message"]
    report = attnres("report", "--out", "r.md", "--no-plots", check=True)
    assert report.returncode == 0 and "Stopped early at step 10" in (workdir / "r.md").read_text()


def test_diverged_run_records_the_step(workdir):
    proc = attnres("launch", "standard", "--seeds", "1", "--steps", "30", *FAST, "--set", "lr=1e4",
                   "--set", "grad_clip=0", "--set", "log_every=1")
    assert proc.returncode == 1 and "diverged" in proc.stdout
    r = runs(workdir)[0]
    assert r["status"] == "diverged" and 1 <= r["stop_step"] < 30


def test_kill_of_a_queued_run_means_it_never_starts(workdir):
    attnres("launch", "standard", "--seeds", "1", "2", "--steps", "400", *FAST, "--detach", check=True)
    trainer = wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["pid"])
    attnres("kill", "2", check=True)
    attnres("kill", "1", check=True)
    wait_for(lambda: not psutil.pid_exists(trainer), timeout=15)  # the whole process tree is gone
    time.sleep(2)
    first, second = runs(workdir)
    assert (first["status"], second["status"]) == ("killed", "killed") and second["started_at"] is None


def test_bad_orchestrator_input_is_one_clear_line(workdir):
    for args, msg in [(["launch", "standard", "--seeds", "1", "1"], "repeats a seed"),
                      (["launch", "standard", "--backend", "k8s"], "unknown backend"),
                      (["launch", "standard", "--kill-if-worse-than", "standard"], "needs --at-step"),
                      (["launch", "standard", "--preset", "huge"], "unknown preset 'huge'"),
                      (["launch", "standard", "--set", "n_layers=2"], "did you mean n_layer?")]:
        proc = attnres(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert msg in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
