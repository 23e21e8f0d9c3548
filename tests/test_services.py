"""Real services started by .ci/run (.ci/services.sh): PostgreSQL and a single-node SLURM."""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest
from helpers import FAST, FAST_GPT2, LONG, attnres, cli_here, runs, wait_for

from attnres.runs.backends.processes import process_alive
from attnres.tracking import run_rows
from attnres.tracking.db import get_engine

pytestmark = pytest.mark.integration

PG = os.environ.get("ATTNRES_TEST_PG_URL")
SLURM = os.environ.get("ATTNRES_TEST_SLURM") == "1"


def test_postgres_holds_a_runs_metrics(workdir, pg_url):
    out = attnres("launch", "standard", "--seeds", "1", "--steps", "6", *FAST, "--db", pg_url, check=True)
    assert "run 1: finished" in out.stdout
    engine = get_engine(pg_url)
    assert engine.dialect.name == "postgresql"
    frame = run_rows.metrics_frame(engine, ["eval_loss", "train_loss"])
    assert set(frame["run_id"]) == {1}
    assert len(frame[frame["key"] == "eval_loss"]) == 2  # steps 0 and 6
    assert "finished" in cli_here("status", "--db", pg_url, check=True).stdout
    cli_here("report", "--out", "r.md", "--db", pg_url, "--no-plots", check=True)
    assert "1 seed (1)" in (workdir / "r.md").read_text()


@pytest.mark.skipif(not SLURM, reason="SLURM not started (.ci/services.sh start sets ATTNRES_TEST_SLURM)")
@pytest.mark.xdist_group("slurm")  # one node: its jobs run one test at a time
def test_slurm_runs_a_tiny_grid_through_sbatch_to_finished(workdir):
    out = attnres("launch", "standard", "control_block", "--seeds", "1", "--steps", "6", *FAST,
                  "--backend", "slurm", check=True).stdout
    assert out.count("submitted as SLURM job") == 2
    wait_for(lambda: all(r["status"] == "finished" for r in runs(workdir)), timeout=600, every=0.5)
    jobs = [r["job_id"] for r in runs(workdir)]
    assert all(jobs) and all(r["backend"] == "slurm" for r in runs(workdir))
    script = (workdir / "logs" / "run-1.sbatch").read_text()
    assert "srun --kill-on-bad-exit=1" in script and "--rdzv_backend=c10d" in script
    for job in jobs:  # the trainer records "finished" just before its SLURM job ends
        wait_for(lambda job=job: "JobState=COMPLETED" in subprocess.run(
            ["scontrol", "show", "job", job], capture_output=True, text=True).stdout)
    with sqlite3.connect(workdir / "runs.db") as conn:
        assert conn.execute("select count(*) from metrics").fetchone()[0] > 0


@pytest.mark.skipif(not SLURM, reason="SLURM not started (.ci/services.sh start sets ATTNRES_TEST_SLURM)")
@pytest.mark.xdist_group("slurm")  # one node: its jobs run one test at a time
def test_slurm_kill_cancels_the_job(workdir):
    attnres("launch", "standard", "--seeds", "9", "--steps", LONG, *FAST, "--backend", "slurm", check=True)
    wait_for(lambda: runs(workdir)[0]["status"] == "running")
    job = runs(workdir)[0]["job_id"]
    cli_here("kill", "1", check=True)
    assert runs(workdir)[0]["status"] == "killed"
    wait_for(lambda: job not in subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True,
                                                text=True).stdout.split())


@pytest.mark.skipif(not SLURM, reason="SLURM not started (.ci/services.sh start sets ATTNRES_TEST_SLURM)")
@pytest.mark.xdist_group("slurm")  # one node: its jobs run one test at a time
def test_slurm_requeue_resumes_from_the_checkpoint(workdir):
    # GPT-2's vocabulary: its slower steps leave the requeue a run still going after step 10
    attnres("launch", "standard", "--seeds", "4", "--steps", "80", *FAST_GPT2, "--set", "checkpoint_every=5",
            "--backend", "slurm", check=True)
    wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["step"] >= 10)
    job, first = runs(workdir)[0]["job_id"], runs(workdir)[0]["pid"]
    subprocess.run(["scontrol", "requeue", job], check=True)  # what preemption with requeue does
    def requeued() -> bool:
        info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        return "JobState=PENDING" in info and "Restarts=1" in info

    def first_attempt_gone() -> bool:  # its step, and the trainer saving its checkpoint, are gone
        steps = subprocess.run(["squeue", "-h", "-s", "-j", job], capture_output=True, text=True).stdout.strip()
        return not steps and runs(workdir)[0]["status"] == "preempted" and not process_alive(first)

    wait_for(requeued)
    # SLURM holds a requeued job back for a while (BeginTime: 2 minutes here) so that the first attempt's step has
    # ended; the test lets it start sooner, but not before: a batch job started on its node while its own previous
    # step still shuts down fails at once (exit code 1, nothing run, not requeued again: one CI run saw it)
    wait_for(first_attempt_gone, timeout=120)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
    try:
        wait_for(lambda: runs(workdir)[0]["status"] == "finished", timeout=600, every=0.5)
    except AssertionError as exc:  # (say why: the job's and the node's state as SLURM sees them)
        seen = [subprocess.run(cmd, capture_output=True, text=True).stdout
                for cmd in (["scontrol", "show", "job", job], ["sinfo", "-N", "-l"])]
        raise AssertionError(f"{exc}; run: {runs(workdir)[0]}; {' '.join(seen)}") from None
    log = (workdir / "logs" / "run-1.log").read_text()
    assert "restart 1" in log  # the same job ran again ...
    with sqlite3.connect(workdir / "runs.db") as conn:
        steps = [s for (s,) in conn.execute("select m.step from metrics m join metric_keys k on k.id = m.key_id "
                                            "where k.name = 'train_loss' order by m.step")]
    assert steps == sorted(set(steps)) and steps[-1] == 80  # ... and continued: no step twice
