"""The queue with real processes: ordering, crashes, resume, preemption, early stop, kill."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from helpers import FAST, LONG, attnres, cli_here, runs, train_steps, wait_for

from attnres.runs.backends.local import process_alive
from attnres.runs.status_view import grid_rows
from attnres.tracking.run_store import RunStore

pytestmark = pytest.mark.integration


def test_detached_queue_runs_cpu_jobs_one_after_the_other(workdir):
    out = cli_here("launch", "standard", "control_block", "--seeds", "1", "--steps", "6", *FAST, "--detach",
                   check=True).stdout
    assert "queue running in the background" in out
    assert [r["status"] for r in runs(workdir)] in (["queued", "queued"], ["running", "queued"])
    wait_for(lambda: all(r["status"] == "finished" for r in runs(workdir)))
    first, second = runs(workdir)
    assert second["started_at"] >= first["ended_at"]
    logs = cli_here("logs", "1", check=True).stdout
    assert "step 6/6" in logs
    header, rows = grid_rows(RunStore(str(workdir / "runs.db")))
    assert header == ["experiment", "variant", "seed 1"] and rows[0][:2] == ["tiny", "standard"]
    assert rows[0][2].startswith("finished 6/6")


def test_sigkill_of_a_trainer_is_failed_within_30s_and_the_queue_goes_on(workdir):
    cli_here("launch", "standard", "--seeds", "1", "2", "--steps", LONG, *FAST, "--set", "log_every=1", "--detach",
             check=True)
    pid = wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["step"] >= 7 and r["pid"])
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)  # mid-write, as likely as not
    wait_for(lambda: runs(workdir)[0]["status"] == "failed", timeout=30)
    assert time.monotonic() - killed_at < 30
    first = runs(workdir)[0]
    assert first["exit_code"] != 0 and "without recording an end" in first["message"]
    steps = train_steps(workdir / "runs.db")
    print(f"FAULT-TABLE sigkill trainer: last step {max(steps)} expected {max(steps)} found {len(steps)}")
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 7  # every step up to the kill, no gap
    wait_for(lambda: runs(workdir)[1]["status"] == "running")  # the next run starts
    status = cli_here("status", check=True).stdout
    assert "failed" in status
    cli_here("kill", "2", check=True)
    assert runs(workdir)[1]["status"] == "killed"
    interrupted = runs(workdir)[0]["step"]
    out = cli_here("resume", "1", "--detach", check=True).stdout  # continues from its last checkpoint
    assert "queue running in the background" in out
    wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["step"] > interrupted)
    assert runs(workdir)[0]["message"] is None  # the old failure is cleared
    cli_here("kill", "--all", check=True)


def test_sigterm_preempts_with_a_checkpoint_and_relaunching_the_grid_resumes(workdir):
    args = ["--steps", LONG, *FAST, "--set", "checkpoint_every=1000"]
    cli_here("launch", "standard", "--seeds", "3", *args, "--detach", check=True)
    run = wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["step"] >= 3 and r)
    os.kill(run["agent_pid"], signal.SIGTERM)  # as a scheduler's preemption does: torchrun forwards it
    wait_for(lambda: runs(workdir)[0]["status"] == "preempted")
    stopped = runs(workdir)[0]["step"]
    assert (workdir / "checkpoints" / "run-1" / "last.pt").exists()
    again = cli_here("launch", "standard", "--seeds", "3", *args, "--set", f"steps={LONG}", "--detach", check=True)
    assert "resume run 1" in again.stdout
    wait_for(lambda: runs(workdir)[0]["step"] > stopped)
    cli_here("kill", "1", check=True)
    assert len(runs(workdir)) == 1


def test_diverged_run_records_the_step(workdir):
    proc = attnres("launch", "standard", "--seeds", "1", "--steps", "30", *FAST, "--set", "lr=1e4",
                   "--set", "grad_clip=0", "--set", "log_every=1")
    assert proc.returncode == 1 and "diverged" in proc.stdout
    r = runs(workdir)[0]
    assert r["status"] == "diverged" and 1 <= r["stop_step"] < 30


def test_kill_of_a_queued_run_means_it_never_starts(workdir):
    out = cli_here("launch", "standard", "--seeds", "1", "2", "--steps", LONG, *FAST, "--detach", check=True).stdout
    queue = int(out.split("(pid ")[1].split(")")[0])
    trainer = wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["pid"])
    cli_here("kill", "2", check=True)
    cli_here("kill", "1", check=True)
    wait_for(lambda: not psutil.pid_exists(trainer))  # the whole process tree is gone ...
    wait_for(lambda: not process_alive(queue))  # ... and the queue has settled both runs and left
    first, second = runs(workdir)
    assert (first["status"], second["status"]) == ("killed", "killed") and second["started_at"] is None


def test_bad_orchestrator_input_is_one_clear_line(workdir):
    """The CLI's side of what tests/test_planning.py checks in process: one line, exit 2."""
    for args, msg in [(["launch", "standard", "--seeds", "1", "1"], "repeats a seed"),
                      (["launch", "standard", "--backend", "k8s"], "unknown backend")]:
        proc = attnres(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert msg in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
