"""A researcher's first hour, with real processes: a queued run says what it waits for (another database's run
on the machine's slot) and takes over a slot whose holder died; kill lets a run save and resume says where it
continues; compare finds the scope holding every named variant; a report early in a grid never compares at
step 0 and takes train loss at the compared step; a one-variant sweep reports against its default value."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import (
    CLI,
    FAST,
    INLINE,
    LONG,
    arms_csv,
    cli_here,
    curve,
    in_process,
    queue_pid,
    runs,
    train_steps,
    wait_for,
)

from attnres import paths


def read_lines(proc: subprocess.Popen, into: list[str]) -> threading.Thread:
    """Collect a process's stdout lines as they come (a wait must be seen while the process still runs)."""
    def pump() -> None:
        for line in proc.stdout:
            into.append(line)
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


@pytest.mark.integration
def test_a_queued_run_says_what_it_waits_for_and_takes_over_a_dead_holders_slot(workdir, monkeypatch):
    other = workdir / "elsewhere" / "other.db"  # another project's database, logs and checkpoints
    other.parent.mkdir()
    with monkeypatch.context() as elsewhere:
        for name in ("LOGS", "CHECKPOINTS"):
            elsewhere.setenv(f"ATTNRES_{name}", str(other.parent / name.lower()))
        held = cli_here("launch", "standard", "--seeds", "1", "--steps", LONG, *FAST, "--detach", "--db", str(other),
                        check=True)
    holder_queue = queue_pid(held.stdout)
    wait_for(lambda: runs(workdir, "elsewhere/other.db") and runs(workdir, "elsewhere/other.db")[0]["status"]
             == "running")
    slot = json.loads((paths.slots_dir() / "cpu").read_text())
    assert slot["run"] == 1 and slot["pid"] == holder_queue and str(other) in slot["db"]

    lines: list[str] = []
    proc = subprocess.Popen([*CLI, "launch", "standard", "--seeds", "2", "--steps", "6",
                             *FAST], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"COLUMNS": "200"})
    try:
        read_lines(proc, lines)
        said = wait_for(lambda: next((ln for ln in lines if "is queued: it waits for" in ln), None))
        assert "run 1 is queued: it waits for the cpu slot: run 1 of" in said and str(other) in said
        assert f"(pid {holder_queue}) since" in said
        shown = cli_here("status", check=True).stdout
        assert "queued" in shown and "the cpu slot: run 1 of" in shown and f"pid {holder_queue}" in shown
        assert runs(workdir)[0]["status"] == "queued"
        os.kill(holder_queue, signal.SIGKILL)  # the holder dies: its slot is taken over, the wait ends
        assert proc.wait(timeout=240) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
        cli_here("kill", "--all", "--db", str(other))
    assert runs(workdir)[0]["status"] == "finished"


def spooled_steps(spool: Path) -> list[int]:
    """The steps of the metric lines in a spool (a line cut by a SIGKILL left out)."""
    steps = []
    for line in spool.read_text(errors="replace").splitlines() if spool.exists() else []:
        try:
            steps.append(int(json.loads(line).get("s", 0)))
        except (ValueError, AttributeError, TypeError):
            continue
    return steps


@pytest.mark.integration
def test_kill_lets_the_run_save_and_resume_says_from_which_step(workdir, monkeypatch):
    cli_here("launch", "standard", "--seeds", "1", "--steps", LONG, *FAST, "--detach", check=True)
    wait_for(lambda: max(train_steps(workdir / "runs.db"), default=0) >= 24)
    # no grace: SIGKILL at once; the checkpoint of its last eval (every 10 steps) is what is left
    monkeypatch.setenv("ATTNRES_KILL_GRACE", "0")
    cli_here("kill", "1", check=True)
    assert runs(workdir)[0]["status"] == "killed"
    # the last step it trained: in the database, or still only in its spool (the writer flushes every second or so)
    before = max(*train_steps(workdir / "runs.db"), *spooled_steps(workdir / "logs" / "run-1.spool.jsonl"))
    out = cli_here("resume", "1", "--detach", check=True).stdout
    step = int(out.split("from step ")[1].split()[0])
    # (its last eval's checkpoint; on a loaded machine the trainer may still save at the SIGTERM first)
    assert 20 <= step <= before + 2, out
    assert "no checkpoint" not in out
    wait_for(lambda: runs(workdir)[0]["status"] == "running" and runs(workdir)[0]["step"] > step + 4)
    # rewritten from there: the first step of the log schedule (every 2) after it; a save at the SIGTERM can be
    # at an odd step
    assert min(s for s in train_steps(workdir / "runs.db") if s > step) == step // 2 * 2 + 2
    # with the grace period, the trainer saves where it is before it goes
    monkeypatch.setenv("ATTNRES_KILL_GRACE", "60")
    cli_here("kill", "1", check=True)
    out = cli_here("resume", "1", "--detach", check=True).stdout
    again = int(out.split("from step ")[1].split()[0])
    assert again > step + 4, out
    cli_here("kill", "1", check=True)


@pytest.mark.integration
def test_resume_without_a_checkpoint_says_it_starts_over(workdir):
    cli_here("launch", "standard", "--seeds", "1", "--steps", LONG, *FAST, "--set", "eval_every=50000", "--detach",
             check=True)
    wait_for(lambda: (r := runs(workdir)) and r[0]["pid"] and r[0]["step"] >= 2)
    trainer = runs(workdir)[0]["pid"]
    os.kill(trainer, signal.SIGSTOP)  # held before its first eval: no checkpoint yet
    assert runs(workdir)[0]["step"] < 50000
    # killed where it stands: `attnres kill` would let it run on to save a checkpoint (SIGTERM, then SIGCONT), and
    # a fast trainer does so even within a grace of 0
    os.kill(trainer, signal.SIGKILL)
    wait_for(lambda: runs(workdir)[0]["status"] == "failed")
    assert not (workdir / "checkpoints" / "run-1").exists() or not os.listdir(workdir / "checkpoints" / "run-1")
    out = cli_here("resume", "1", "--detach", check=True).stdout
    assert "run 1 (standard, seed 1): no checkpoint: starting over from step 0" in out, out
    wait_for(lambda: runs(workdir)[0]["status"] == "running" and runs(workdir)[0]["step"] >= 4)
    cli_here("kill", "1", check=True)


def test_compare_finds_the_scope_that_holds_every_named_variant(workdir, capsys, monkeypatch):
    # control_block's runs are in "older"; the newest experiment holding standard ("newer") has none of them
    in_process(["import", str(arms_csv(workdir, {"standard": {1: 3.0, 2: 3.1}, "control_block": {1: 2.9, 2: 3.0}},
                                   "older", "a.csv"))], capsys, monkeypatch)
    in_process(["import", str(arms_csv(workdir, {"standard": {1: 3.2, 2: 3.3}, "full_attnres": {1: 3.0, 2: 3.1}},
                                   "newer", "b.csv"))], capsys, monkeypatch)
    code, out, err = in_process(["compare", "standard", "control_block"], capsys, monkeypatch)
    assert code == 0, err
    assert "experiment older" in out and "control_block" in out
    # a second scope holding both is named, with the flags that select it
    in_process(["import", str(arms_csv(workdir, {"standard": {3: 3.0}, "control_block": {3: 2.8}}, "third",
                                   "c.csv"))], capsys, monkeypatch)
    code, out, err = in_process(["compare", "standard", "control_block"], capsys, monkeypatch)
    assert code == 0 and "experiment third" in out.splitlines()[0] + out
    assert "also holding these variants: experiment older" in out and "--experiment older" in out
    # none holds both: the error says where each one's runs are
    code, _, err = in_process(["compare", "full_attnres", "control_block"], capsys, monkeypatch)
    assert code == 2 and "full_attnres: experiment newer" in err and "control_block: experiment" in err


@pytest.mark.integration
def test_a_report_early_in_a_grid_never_compares_at_step_0(workdir):
    # one machine slot: standard trains first while control_block waits; a stopped trainer holds its step
    cli_here("launch", "standard", "control_block", "--seeds", "1", "--steps", LONG, *FAST,
             "--set", "eval_every=1000", "--detach", check=True)  # (stopped long before its first eval)
    wait_for(lambda: (r := runs(workdir)) and r[0]["pid"] and r[0]["step"] >= 2)
    trainer = runs(workdir)[0]["pid"]
    os.kill(trainer, signal.SIGSTOP)
    try:
        assert runs(workdir)[0]["step"] < 1000 and set(curve(workdir, 1, "eval_loss")) == {0}
        done = cli_here("report", "--out", "r.md", "--no-plots")
        assert done.returncode == 2 and "too early" in done.stderr and "step 0 is the initialisation" in done.stderr
        os.kill(trainer, signal.SIGCONT)
        wait_for(lambda: runs(workdir)[0]["step"] >= 1004)
        os.kill(trainer, signal.SIGSTOP)
        at = max(curve(workdir, 1, "eval_loss"))
        cli_here("report", "--out", "r.md", "--no-plots", check=True)
        results = (workdir / "r.md").read_text().split("## Results")[1].split("\n## ")[0]
        assert f"at step {at:,}" in results and f"Train Loss @ {at:,}" in results, results
        row = next(ln for ln in results.splitlines() if ln.startswith("| standard"))
        assert f"{curve(workdir, 1, 'train_loss')[at]:.3f}" in row  # the train loss of that step, not the latest
        assert "| control_block" not in results  # queued: nothing to compare yet
        cmp = cli_here("compare", "standard", "control_block")
        assert cmp.returncode == 2 and "no eval loss recorded for: control_block" in cmp.stderr
        assert "(in experiment tiny" in cmp.stderr
    finally:
        os.kill(trainer, signal.SIGCONT)
        cli_here("kill", "--all")


@pytest.mark.integration
def test_a_one_variant_sweep_reports_against_its_default_value(workdir):
    out = cli_here("launch", "control_block", "--seeds", "1", "2", "--steps", "6", *FAST, "--set", "lr=1e-3,3e-3",
                   "--on-end", f"{sys.executable} -c \"import os,json; open(os.environ['ATTNRES_RUN_ID'] + '.json', "
                   "'w').write(json.dumps(dict(os.environ)))\"", *INLINE, check=True)
    assert out.returncode == 0
    done = cli_here("report", "--out", "r.md", "--no-plots", "--tuned", "lr", check=True)
    assert done.returncode == 0
    text = (workdir / "r.md").read_text()
    assert "Baseline = control_block@lr=0.003" in text  # the tiny preset's own lr
    assert "| control_block@lr=0.001" in text and "compared against control_block@lr=0.003 (its default)" in text
    env = wait_for(lambda: [json.loads(p.read_text()) for p in sorted(workdir.glob("*.json"))
                            if p.stat().st_size] if len(list(workdir.glob("*.json"))) == 4 else None)
    lrs = sorted(e["ATTNRES_SET_LR"] for e in env)
    assert lrs == ["0.001", "0.001", "0.003", "0.003"]
    assert all(f"lr={e['ATTNRES_SET_LR']}" in e["ATTNRES_SETTINGS"].split(",") for e in env)


@pytest.mark.integration
def test_an_earlier_launchs_queued_runs_start_before_a_later_ones(workdir):
    first = cli_here("launch", "standard", "--seeds", "1", "2", "--steps", "30", *FAST, "--detach", check=True)
    wait_for(lambda: (r := runs(workdir)) and r[0]["status"] == "running")
    cli_here("launch", "control_block", "--seeds", "1", "--steps", "6", *FAST, "--detach", check=True)
    wait_for(lambda: len(runs(workdir)) == 3 and all(r["status"] == "finished" for r in runs(workdir)))
    started = {r["id"]: r["started_at"] for r in runs(workdir)}
    assert started[1] < started[2] < started[3], started
    assert queue_pid(first.stdout)
