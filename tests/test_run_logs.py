"""A run's log: one header line per attempt, progress within seconds, and a checkpoint at each eval by default."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
from helpers import FAST, LONG, cli_here, runs, wait_for

from attnres.tracking import states
from attnres.training import checkpoint, loop
from attnres.training.distributed import single
from attnres.training.loop import MemoryRecorder, train
from attnres.variants.registry import resolve_run

# a one-layer model on the byte corpus: a step takes milliseconds
SMALL = ["batch_size=2", "eval_batches=1", "warmup=2", "log_every=1", "n_layer=1", "d_model=32", "n_head=2",
         "seq_len=32", "vocab_size=320"]
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def cfg(steps: int, *extra: str):
    return resolve_run("standard", "tiny", 5, [*SMALL, f"steps={steps}", *extra], "builtin-bytes")


def header_re(run: str, variant: str, seed: int, config: str, attempt: int, step: int) -> re.Pattern:
    where = f"resumed from step {step}" if step else "starting at step 0"
    return re.compile(rf"attnres run {run} · variant {variant} · seed {seed} · config {config} · device .+ · "
                      rf"threads \d+ · started {STAMP} · attempt {attempt} · {where}")


def progress_steps(out: str, steps: int) -> list[int]:
    """The steps of the time-based progress lines (`step N/T train X · R tok/s`) in ``out``."""
    return [int(m[1]) for m in re.finditer(rf"^step (\d+)/{steps} train \d+\.\d{{4}} · [\d,]+ tok/s$", out, re.M)]


@pytest.mark.integration
def test_each_attempt_starts_the_log_with_a_header_and_a_killed_tiny_run_resumes_from_its_last_eval(workdir):
    # Too long to finish: the kills always find it going. FAST evals every 10 steps; checkpoint_every is tiny's 0.
    cli_here("launch", "standard", "--seeds", "7", "--steps", LONG, *FAST, "--detach", check=True)
    ck, log = workdir / "checkpoints" / "run-1", workdir / "logs" / "run-1.log"
    run = wait_for(lambda: (r := runs(workdir)) and r[0]["status"] == "running" and r[0]["pid"]
                   and (ck / "last.pt").exists() and r[0])
    os.kill(run["pid"], signal.SIGKILL)  # no checkpoint on the way out: the newest is an eval's
    wait_for(lambda: runs(workdir)[0]["status"] == states.FAILED)
    config = json.loads(run["config_json"])["train"]
    assert (config["checkpoint_every"], config["eval_every"]) == (0, 10)
    resumes_at = checkpoint.step_of(ck)
    assert resumes_at and resumes_at % 10 == 0  # an eval step, not 0

    first = log.read_text().splitlines()
    assert header_re("1", "standard", 7, run["config_hash"], 1, 0).fullmatch(first[0]), first[:3]
    assert progress_steps(first[1], int(LONG)) == [1]  # progress on the first step, long before its first eval
    cli_here("resume", "1", "--detach", check=True)
    wait_for(lambda: "attempt 2" in log.read_text())
    cli_here("kill", "1", check=True)
    headers = [line for line in log.read_text().splitlines() if line.startswith("attnres run ")]
    assert len(headers) == 2 and headers[0] == first[0]
    assert header_re("1", "standard", 7, run["config_hash"], 2, resumes_at).fullmatch(headers[1]), headers


class Crash(BaseException):
    """The trainer's process dying after a step: no checkpoint on the way out."""


@pytest.mark.parametrize(("extra", "crash_at", "resumes_at"), [
    (["eval_every=4"], 6, 4),  # the default, checkpoint_every=0: a checkpoint at each eval
    (["eval_every=2", "checkpoint_every=5"], 7, 5),  # every N steps: at those, not at the evals
])
def test_a_run_checkpoints_at_each_eval_by_default_and_resumes_from_there(workdir, capsys, extra, crash_at,
                                                                             resumes_at):
    run = cfg(12, *extra)

    class CrashAt(MemoryRecorder):
        def progress(self, step: int) -> None:
            super().progress(step)
            if step == crash_at:
                raise Crash

    with pytest.raises(Crash):
        train(run, single(), CrashAt(), workdir / "ck", run_id=4)
    assert checkpoint.step_of(workdir / "ck") == resumes_at
    capsys.readouterr()
    rec = MemoryRecorder()
    ending = train(run, single(), rec, workdir / "ck", run_id=4, attempt=2)
    assert (ending.status, ending.step) == (states.FINISHED, 12) and min(rec.metrics["train_loss"]) == resumes_at + 1
    out = capsys.readouterr().out.splitlines()
    assert header_re("4", "standard", 5, run.config_hash, 2, resumes_at).fullmatch(out[0]), out[:2]


def test_progress_is_printed_by_time_besides_the_evals(workdir, capsys, monkeypatch):
    run = cfg(6, "eval_every=3")
    monkeypatch.setattr(loop, "PRINT_EVERY_S", 1e9)  # never by time: the first step's line only
    train(run, single(), MemoryRecorder(), workdir / "a")
    out = capsys.readouterr().out
    assert header_re("untracked", "standard", 5, run.config_hash, 1, 0).fullmatch(out.splitlines()[0]), out
    assert progress_steps(out, 6) == [1]
    assert re.findall(r"^step (\d)/6 train \d+\.\d{4} eval \d+\.\d{4}$", out, re.M) == ["3", "6"]

    monkeypatch.setattr(loop, "PRINT_EVERY_S", 0.0)  # due at every step: every step that is not an eval's
    train(run, single(), MemoryRecorder(), workdir / "b")
    out = capsys.readouterr().out
    assert progress_steps(out, 6) == [1, 2, 4, 5]
    assert re.findall(r"^step (\d)/6 train \d+\.\d{4} eval \d+\.\d{4}$", out, re.M) == ["3", "6"]
