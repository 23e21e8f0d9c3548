"""A researcher's first hour (issue 31): a dry run's plan lines say what each run would be recorded as, the
usual slips (``--seeds 1,2``, a mistyped ``--set`` key) get one line that says what to type instead, an ETA
reads as a duration, and ``status --watch`` into a pipe writes plain lines and ends by itself."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
import pytest
from helpers import attnres, in_process

from attnres.runs.status_view import _cell, duration


def plan_lines(out: str) -> list[str]:
    """The plan lines of a dry run (each is followed by its torchrun command, indented)."""
    return [line for line in out.splitlines() if line and not line.startswith(" ")]


def test_a_plan_line_shows_the_experiment_the_data_and_the_set_values(workdir, capsys, monkeypatch):
    code, out, err = in_process(["launch", "standard", "--seeds", "1", "--dry-run", "--set", "lr=1e-3",
                                 "--data", "builtin", "--experiment", "e1"], capsys, monkeypatch)
    assert code == 0, err
    [line] = plan_lines(out)
    assert line.startswith("standard seed=1 preset=tiny steps=200 ")
    for part in ("experiment=e1", "data=builtin", "lr=1e-3"):
        assert f" {part} " in line, line
    assert line.endswith("— run")
    assert not (workdir / "runs.db").exists()


def test_a_swept_cell_shows_its_value_and_the_fixed_settings(workdir, capsys, monkeypatch):
    code, out, err = in_process(["launch", "standard", "--seeds", "1", "--dry-run", "--set", "lr=1e-3,3e-3",
                                 "--set", "n_layer=2", "--steps", "50"], capsys, monkeypatch)
    assert code == 0, err
    lines = plan_lines(out)
    assert [line.split()[1] for line in lines] == ["lr=1e-3", "lr=3e-3"]  # the cell, right after the variant
    for line in lines:
        assert " experiment=tiny " in line and " n_layer=2 " in line and " steps=50 " in line, line
        assert line.count("lr=") == 1 and line.count("steps=") == 1, line


def test_seeds_with_commas_answer_with_the_spelling_that_works(workdir, capsys, monkeypatch):
    for given in (["1,2"], ["1,", "2"], ["--seeds=1,2"]):
        args = ["launch", "standard", "--dry-run", *(given if given[0].startswith("--") else ["--seeds", *given])]
        code, out, err = in_process(args, capsys, monkeypatch)
        assert (code, out) == (2, ""), (given, out, err)
        assert err == "error: --seeds takes seeds separated by spaces: --seeds 1 2\n", (given, err)
    code, out, err = in_process(["launch", "standard", "--dry-run", "--seeds", "x"], capsys, monkeypatch)
    assert code == 2 and err == "error: bad --seeds 'x': a seed is a whole number, e.g. --seeds 42 1337\n", err
    code, out, err = in_process(["launch", "standard", "--dry-run", "--seeds", "42", "1337"], capsys, monkeypatch)
    assert code == 0, err
    assert [line.split()[1] for line in plan_lines(out)] == ["seed=42", "seed=1337"]


def test_an_unknown_set_key_names_the_closest_one(workdir, capsys, monkeypatch):
    code, out, err = in_process(["launch", "standard", "--seeds", "1", "--dry-run", "--set", "lrr=1e-3"],
                                capsys, monkeypatch)
    assert (code, out) == (2, "")
    assert err == "error: unknown setting 'lrr'; did you mean 'lr'?\n"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (45, "45s"), (59.6, "1m00s"), (245, "4m05s"), (3599.6, "1h00m"), (3720, "1h02m"), (96000, "26h40m"),
])
def test_a_duration_never_reads_as_a_clock_time(seconds, text):
    assert duration(seconds) == text


def test_a_running_cell_shows_its_eta_as_a_duration():
    now = datetime(2025, 1, 1, 12, 0, 0)
    run = pd.Series({"id": 1, "status": "running", "step": 50, "total_steps": 200,
                     "started_at": now - timedelta(seconds=82), "stop_step": None})
    assert _cell(run, now, {}) == "running 50/200 ETA 4m06s"


@pytest.mark.integration
def test_status_watch_into_a_pipe_writes_plain_lines_and_ends_by_itself(workdir, capsys, monkeypatch):
    csv = workdir / "runs.csv"
    csv.write_text("variant,seed,step,key,value,status\n"
                   "standard,1,100,eval_loss,3.5,finished\nstandard,2,100,eval_loss,3.6,finished\n"
                   "control_block,1,100,eval_loss,3.4,finished\n")
    assert in_process(["import", str(csv)], capsys, monkeypatch)[0] == 0
    proc = attnres("status", "--watch", "--interval", "0.2", timeout=60)  # stdout is a pipe: no terminal
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout and "\r" not in proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("0 run(s) queued or running"), lines
    assert [cell.strip() for cell in lines[1].split("|")] == ["experiment", "variant", "seed 1", "seed 2"]
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")] for line in lines[2:]}
    assert rows["standard"][2:] == ["finished 100/100", "finished 100/100"]
    assert rows["control_block"][2:] == ["finished 100/100", "—"]
    assert len(lines) == 4  # one refresh: nothing was queued or running
