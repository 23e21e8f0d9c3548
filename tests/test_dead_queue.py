"""A dead queue strands no run, and the first command after a crash works: real queues and trainers killed with
SIGKILL, then a relaunch or a resume with no `attnres status` in between."""

from __future__ import annotations

import os
import signal

import pytest
from helpers import FAST, LONG, attnres, cli_here, queue_pid, runs, wait_for

pytestmark = pytest.mark.integration

GRID = ["launch", "standard", "--seeds", "1", "2", "3", "--steps", "200", *FAST]  # (run 1 long enough to be seen)


def test_runs_queued_by_a_queue_that_died_are_continued_by_the_same_launch_again(workdir):
    queue = queue_pid(cli_here(*GRID, "--detach", check=True).stdout)
    wait_for(lambda: (r := runs(workdir)) and r[0]["status"] == "running")
    os.kill(queue, signal.SIGKILL)  # run 1's trainer goes on (its own session); runs 2 and 3 lose their queue
    wait_for(lambda: runs(workdir)[0]["status"] == "finished")
    assert [r["status"] for r in runs(workdir)[1:]] == ["queued", "queued"]
    shown = cli_here("status", check=True).stdout
    assert "preempted" in shown and "attnres resume 2 3" in shown, shown
    again = attnres(*GRID, check=True)  # the same launch continues them: no "already queued", nothing new
    assert "already queued" not in again.stdout
    assert [(r["id"], r["status"]) for r in runs(workdir)] == [(1, "finished"), (2, "finished"), (3, "finished")]


def test_resume_right_after_the_queue_died_needs_no_status_first(workdir):
    queue = queue_pid(cli_here(*GRID, "--detach", check=True).stdout)
    wait_for(lambda: (r := runs(workdir)) and r[0]["status"] == "running")
    os.kill(queue, signal.SIGKILL)
    wait_for(lambda: runs(workdir)[0]["status"] == "finished")
    out = cli_here("resume", "2", "3", check=True).stdout
    assert "run 2 (standard, seed 2)" in out and "run 3 (standard, seed 3)" in out
    assert [r["status"] for r in runs(workdir)] == ["finished"] * 3


def test_after_a_power_cut_the_first_resume_works(workdir, monkeypatch):
    queue = queue_pid(cli_here("launch", "standard", "--seeds", "1", "--steps", LONG, *FAST, "--detach",
                               check=True).stdout)
    wait_for(lambda: (r := runs(workdir)) and r[0]["status"] == "running" and r[0]["pid"] and r[0]["agent_pid"]
             and r[0]["step"] >= 12)
    run = runs(workdir)[0]
    for pid in (queue, run["agent_pid"], run["pid"]):  # everything dies at once
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
                             for p in (queue, run["agent_pid"], run["pid"])))
    assert runs(workdir)[0]["status"] == "running"  # nothing recorded the crash
    monkeypatch.setenv("ATTNRES_KILL_GRACE", "0")
    out = cli_here("resume", "1", "--detach", check=True).stdout  # no `attnres status` first
    assert "run 1 (standard, seed 1): from step " in out, out
    wait_for(lambda: runs(workdir)[0]["status"] == "running" and runs(workdir)[0]["pid"] != run["pid"])
    cli_here("kill", "1", check=True)
