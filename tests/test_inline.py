"""The inline backend: runs trained in the launching process record what torchrun's runs record, Ctrl-C and
`attnres kill` stop them with a checkpoint, and what it cannot do is one line before anything is queued."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from helpers import CLI, FAST, LONG, cli_here, curve, runs, train_steps, wait_for

from attnres.runs.torchrun import cuda_build

pytestmark = pytest.mark.integration

INLINE = ["--backend", "inline"]


def test_an_inline_run_records_the_curves_and_conditions_of_the_same_run_under_torchrun(workdir, monkeypatch):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    args = ["launch", "standard", "control_block", "--seeds", "7", *FAST, "--steps", "12", "--set", "log_every=1"]
    cli_here(*args, "--db", "torchrun.db", check=True)  # the local backend: a torchrun and a trainer a run
    for name in ("LOGS", "CHECKPOINTS"):  # (the same run ids: their own logs and checkpoints)
        monkeypatch.setenv(f"ATTNRES_{name}", str(workdir / "inline" / name.lower()))
    out = cli_here(*args, *INLINE, "--db", "inline.db", check=True).stdout
    assert "run 2: finished" in out, out
    here = runs(workdir, "inline.db")
    assert [(r["status"], r["backend"], r["pid"], r["agent_pid"]) for r in here] == [
        ("finished", "inline", os.getpid(), None)] * 2
    for rid in (1, 2):
        for key in ("train_loss", "eval_loss", "grad_norm"):
            assert curve(workdir, rid, key, "inline.db") == curve(workdir, rid, key, "torchrun.db"), (rid, key)
    log = (workdir / "inline" / "logs" / "run-2.log").read_text()
    assert log.startswith("attnres run 2 · variant control_block") and "step 12/12" in log
    # the same conditions (compute threads, one rank) but how the trainer's process started (which a CPU's peak
    # memory depends on), and the launching process is as it was: its signal handlers are its own again
    def conditions(rows: list[dict]) -> list[list[dict]]:  # (the machine's load during each run is its own)
        return [[{k: v for k, v in c.items() if not k.startswith("load") and k != "process"}
                 for c in json.loads(r["conditions_json"])] for r in rows]

    assert conditions(here) == conditions(runs(workdir, "torchrun.db"))
    def processes(rows: list[dict]) -> list[set[str]]:
        return [{c["process"] for c in json.loads(r["conditions_json"])} for r in rows]

    assert processes(runs(workdir, "torchrun.db")) == [{"interpreter" if cuda_build() else "forked"}] * 2
    assert processes(here) == [{"inline"}] * 2
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_kill_and_ctrl_c_stop_inline_runs_with_a_checkpoint_and_the_process_goes_on(workdir, monkeypatch):
    monkeypatch.setenv("ATTNRES_KILL_GRACE", "120")  # (a loaded machine: the kill waits for the checkpoint)
    proc = subprocess.Popen([*CLI, "launch", "standard", "--seeds", "1", "2", "3",
                             *FAST, "--steps", LONG, *INLINE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=os.environ | {"COLUMNS": "200"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        db = workdir / "runs.db"
        wait_for(lambda: max(train_steps(db, 1), default=0) >= 2)
        cli_here("kill", "1", check=True)  # from another "terminal": the run saves and stops, the process goes on
        first = runs(workdir)[0]
        assert first["status"] == "killed" and (workdir / "checkpoints" / "run-1").is_dir()
        wait_for(lambda: max(train_steps(db, 2), default=0) >= 2)
        assert proc.poll() is None and runs(workdir)[1]["pid"] == proc.pid
        # run 1 relaunched on the local backend waits for the slot the launcher holds; killed while it waits,
        # it loses its queue's place, and nothing reaches the launcher (the pid run 1 last recorded)
        again = cli_here("launch", "standard", "--seeds", "1", *FAST, "--steps", LONG, "--detach", check=True)
        assert "resume run 1" in again.stdout, again.stdout
        wait_for(lambda: runs(workdir)[0]["status"] == "queued")
        cli_here("kill", "1", check=True)
        assert runs(workdir)[0]["status"] == "killed" and proc.poll() is None
        assert runs(workdir)[1]["status"] == "running"
        proc.send_signal(signal.SIGINT)  # Ctrl-C: this run checkpoints, the one not started is set aside
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Ctrl-C again stops at once" in err  # (said on the terminal, not in the run's log)
    assert [r["status"] for r in runs(workdir)] == ["killed", "preempted", "preempted"], err
    assert (workdir / "checkpoints" / "run-2").is_dir() and not (workdir / "checkpoints" / "run-3").exists()
    assert "not started" in runs(workdir)[2]["message"]
    steps = train_steps(db, 2)
    assert steps == list(range(2, steps[-1] + 1, 2)), "a hole in the stopped run's curve"
    # its resume (where the run was trained: here) cannot detach; the refusal changes nothing
    refused = cli_here("resume", "2", "--detach")
    assert refused.returncode == 2 and "--detach" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert runs(workdir)[1]["status"] == "preempted"


@pytest.mark.parametrize("extra, says", [(["--detach"], "cannot return before its runs end"),
                                         (["--nproc", "2"], "trains one rank")])
def test_what_inline_cannot_do_is_one_line_and_nothing_is_queued(workdir, extra, says):
    got = cli_here("launch", "standard", "--seeds", "1", *FAST, "--steps", "4", *INLINE, *extra)
    assert got.returncode == 2 and says in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert not (workdir / "runs.db").exists() or runs(workdir) == []
