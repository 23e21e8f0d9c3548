"""`--on-end CMD`: the user's command runs once when a run ends, with the run's facts in its environment."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import FAST, INLINE, LONG, attnres, cli_here, curve, in_process, queue_pid, runs, wait_for

from attnres.runs.backends.local import process_alive

HOOK = """import json, os, sys
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps({k: v for k, v in os.environ.items() if k.startswith("ATTNRES_")}) + "\\n")
"""


def _ends(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.integration
def test_the_command_runs_once_per_run_with_its_state_and_last_eval(workdir):
    hook, ends = workdir / "hook.py", workdir / "ends.jsonl"
    hook.write_text(HOOK)
    attnres("launch", "standard", "--seeds", "42", "1337", *FAST, "--steps", "12", "--on-end",
            f"{sys.executable} {hook} {ends}", check=True)
    assert json.loads(runs(workdir)[0]["on_end_json"]) == [sys.executable, str(hook), str(ends)]  # (absolute)
    got = sorted(_ends(ends), key=lambda e: int(e["ATTNRES_RUN_ID"]))
    assert [e["ATTNRES_RUN_ID"] for e in got] == ["1", "2"]  # once each: the trainer waited for it
    for e, seed in zip(got, ("42", "1337"), strict=True):
        evals = curve(workdir, int(e["ATTNRES_RUN_ID"]), "eval_loss")
        assert e["ATTNRES_STATE"] == "finished" and e["ATTNRES_VARIANT"] == "standard" and e["ATTNRES_SEED"] == seed
        assert e["ATTNRES_LAST_EVAL_STEP"] == "12" and float(e["ATTNRES_LAST_EVAL"]) == evals[12]
        assert e["ATTNRES_STEP"] == e["ATTNRES_TOTAL_STEPS"] == "12" and e["ATTNRES_LOG"].endswith(".log")

    # a command that fails is one warning in the run's log; the run is still finished
    cli_here("launch", "control_block", "--seeds", "42", *FAST, "--steps", "12", "--on-end", "false", *INLINE,
             check=True)
    run = runs(workdir)[2]
    assert run["status"] == "finished"
    log = (workdir / "logs" / f"run-{run['id']}.log").read_text()
    assert log.count("attnres: warning: run 3's --on-end command 'false' exited with 1") == 1


@pytest.mark.integration
def test_a_killed_run_notifies_from_the_kill_and_from_nowhere_else(workdir):
    hook, ends = workdir / "hook.py", workdir / "ends.jsonl"
    hook.write_text(HOOK)
    out = cli_here("launch", "standard", "--seeds", "7", *FAST, "--steps", LONG, "--detach", "--on-end",
                   f"{sys.executable} {hook} {ends}", check=True).stdout
    wait_for(lambda: runs(workdir) and runs(workdir)[0]["status"] == "running" and runs(workdir)[0]["step"] >= 2)
    cli_here("kill", "1", check=True)
    wait_for(lambda: not process_alive(queue_pid(out)))  # the trainer and its queue have had their say
    got = _ends(ends)
    assert len(got) == 1 and got[0]["ATTNRES_STATE"] == "killed" and got[0]["ATTNRES_RUN_ID"] == "1"
    assert runs(workdir)[0]["status"] == "killed"


def test_a_command_that_cannot_run_is_refused_at_launch(workdir, capsys, monkeypatch):
    for bad, says in (("no-such-command-attnres", "not found"), ("echo 'unclosed", "No closing quotation"),
                      ("", "needs a command")):
        code, _, err = in_process(["launch", "standard", "--on-end", bad], capsys, monkeypatch)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not (workdir / "runs.db").exists()
