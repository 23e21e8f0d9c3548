"""torchrun's workers forked from its agent (``--start-method fork``, :mod:`attnres.runs.fork_worker`): a run's
trainer starts with the agent's imports, and behaves as a trainer started as a new interpreter does: a SIGTERM
to the trainer alone (not through torchrun) saves a checkpoint and ends the run preempted, a SIGINT fails it,
and torchrun ends either way (a forked worker that returned without its result would leave it waiting)."""

from __future__ import annotations

import os
import signal

import pytest
from helpers import FAST, LONG, cli_here, runs, train_steps, wait_for

from attnres.runs.backends.local import process_alive
from attnres.runs.fork_worker import TERMINATED
from attnres.runs.torchrun import cuda_build, forked


def test_only_a_fork_of_attnres_train_runs_as_the_fork_worker():
    given = ["--standalone", "--nproc_per_node=2", "--start-method", "fork", "-m", "attnres.train", "--",
             "--run-id", "3", "--db", "sqlite:///x.db"]
    got = forked(given)
    if cuda_build():  # (a CUDA build's agent has asked CUDA for its devices: its workers start as new interpreters)
        assert got == given
        return
    assert got[:4] == given[:4] and got[4] == "--run-path" and got[5].endswith("attnres/runs/fork_worker.py")
    assert got[6:] == ["--", "--run-id", "3", "--db", "sqlite:///x.db"]
    for other in (given[:2] + given[4:],  # the default start method: torchrun's new interpreters
                  [*given[:5], "other.module", *given[6:]],  # another module
                  ["--standalone", "--start-method", "fork", "train.py", "--lr", "1"]):  # a script
        assert forked(other) == other


@pytest.mark.integration
def test_a_forked_trainer_stopped_by_sigterm_alone_is_preempted_and_torchrun_ends(workdir):
    cli_here("launch", "standard", "--seeds", "1", "--steps", LONG, *FAST, "--set", "checkpoint_every=2", "--set",
             "log_every=1", "--detach", check=True)
    run = wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["step"] >= 4 and r)
    with open(f"/proc/{run['pid']}/cmdline", "rb") as a, open(f"/proc/{run['agent_pid']}/cmdline", "rb") as b:
        assert a.read() == b.read()  # forked from its agent: no new interpreter
    os.kill(run["pid"], signal.SIGTERM)  # the trainer alone (a user's `kill PID`)
    wait_for(lambda: not process_alive(run["agent_pid"]) and not process_alive(run["pid"]))  # none waits on it
    r = runs(workdir)[0]
    assert r["status"] == "preempted", r
    log = (workdir / "logs" / "run-1.log").read_text()
    assert f"exitcode  : {TERMINATED}" in log  # torchrun says how its worker ended
    stopped = r["step"]
    assert train_steps(workdir / "runs.db") == list(range(1, stopped + 1))
    cli_here("resume", "1", "--detach", check=True)  # and it continues from its checkpoint
    again = wait_for(lambda: (x := runs(workdir)[0])["status"] == "running" and x["step"] > stopped and x)
    os.kill(again["pid"], signal.SIGINT)  # the trainer alone interrupted: it fails the run, and torchrun ends
    wait_for(lambda: not process_alive(again["agent_pid"]) and not process_alive(again["pid"]))
    assert runs(workdir)[0]["status"] == "failed"
