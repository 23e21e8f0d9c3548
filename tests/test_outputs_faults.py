"""Issue 32: outputs written whole, unwritable outputs and bad seeds refused at parse time, and faults around a run
(a checkpoint or log folder deleted, a trainer started after its run was killed, a silent heartbeat, GPUs asked for
on a CPU machine, values too large to average) ending in one line and a consistent state."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from helpers import FAST, attnres, in_process, runs

from attnres import outputs
from attnres.errors import AttnresError
from attnres.tracking import run_rows, states
from attnres.tracking.db import get_engine
from attnres.training import checkpoint
from attnres.variants.registry import resolve_run

STEPS = 1000  # eval points per run of the generated file: 4 runs, 4,000 metric rows


def one_line(err: str) -> bool:
    """The CLI's answer to bad input: exactly one line, an error, no traceback."""
    return err.startswith("error: ") and err.strip().count("\n") == 0 and "Traceback" not in err


def listing(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) and its content's hash; the database's files left out (a read
    may fold SQLite's write-ahead log into it: the same content in other bytes)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*")) if not p.name.startswith("runs.db")}


def metric_file(path: Path, values: dict[tuple[str, int], float] | None = None, steps: int = STEPS) -> Path:
    """A metric file of two variants x two seeds, eval loss at ``steps`` steps each (``values``: one value per
    (variant, seed) at every step instead of a falling curve)."""
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["variant", "seed", "step", "key", "value"])
        for variant in ("standard", "control_block"):
            for seed in (1, 2):
                for step in range(steps):
                    shift = seed / 100 - (variant != "standard") / 20
                    value = values[variant, seed] if values else 4.0 - step / steps + shift
                    out.writerow([variant, seed, step * 10, "eval_loss", value])
    return path


@pytest.fixture
def imported(workdir, capsys, monkeypatch) -> Path:
    """runs.db holding the 4,000 rows of :func:`metric_file`, recorded by ``attnres import``."""
    code, _, err = in_process(["import", str(metric_file(workdir / "m.csv"))], capsys, monkeypatch)
    assert code == 0, err
    return workdir / "runs.db"


class Reader(threading.Thread):
    """Reads a file over and over while a command rewrites it; keeps every read that was not a whole file."""

    def __init__(self, path: Path, whole) -> None:
        super().__init__(daemon=True)
        self.path, self.whole = path, whole
        self.stop, self.reads, self.bad = threading.Event(), 0, []
        self.seen = False  # a whole file was read once: from then on it must never be absent

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                if self.seen:
                    self.bad.append("absent after it was written")
                continue
            self.reads += 1
            if self.whole(data):
                self.seen = True
            else:
                self.bad.append(f"{len(data)} bytes: {data[-60:]!r}")


def full_metrics(data: bytes) -> bool:
    rows = list(csv.reader(io.StringIO(data.decode())))
    return bool(rows) and rows[0][:6] == ["run", "variant", "seed", "step", "key", "value"] \
        and len(rows) == 1 + 4 * STEPS and all(len(r) == len(rows[0]) for r in rows)


# -- 4. every output is the old file or the whole new one ---------------------------------------------
def test_a_reader_polling_export_and_report_never_sees_a_partial_file(imported, workdir, capsys, monkeypatch):
    reader = Reader(workdir / "export" / "metrics.csv", full_metrics)
    reader.start()
    for _ in range(2):  # the second writes over the first
        code, _, err = in_process(["export", "--out", "export"], capsys, monkeypatch)
        assert code == 0, err
    reader.stop.set()
    reader.join()
    assert reader.seen and reader.reads > 1 and reader.bad == []
    assert sorted(os.listdir(workdir / "export")) == ["metrics.csv", "runs.csv"]  # no temporary file left

    md = workdir / "out" / "results.md"
    png = workdir / "out" / "results_figures" / "delta_curves.png"
    versions: set[bytes] = set()
    text = Reader(md, lambda d: versions.add(d) or len(d) > 0)
    figure = Reader(png, lambda d: d.startswith(b"\x89PNG") and d.endswith(b"IEND\xaeB`\x82"))
    for r in (text, figure):
        r.start()
    for _ in range(2):
        code, _, err = in_process(["report", "--out", str(md)], capsys, monkeypatch)
        assert code == 0, err
    for r in (text, figure):
        r.stop.set()
        r.join()
        assert r.seen and r.bad == [], r.bad[:3]
    assert versions == {md.read_bytes()}  # both writes made the same document: every read was all of it
    assert not [p for p in (workdir / "out").rglob(".*")]


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = outputs.write_text(tmp_path / "a.md", "old\n")
    with pytest.raises(RuntimeError), outputs.atomic(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["a.md"]
    outputs.write_bytes(target, b"new\n")
    assert target.read_bytes() == b"new\n" and os.listdir(tmp_path) == ["a.md"]


# -- 5. unwritable outputs: one line before any work --------------------------------------------------
@pytest.mark.parametrize(("args", "says"), [
    (["report", "--out", "existing"], "--out existing is a folder: give a file name, e.g. existing/attnres-results.md"),
    (["report", "--out", "/"], "--out / is a folder: give a file name, e.g. /attnres-results.md"),
    (["compare", "standard", "control_block", "--out", "existing"], "--out existing is a folder"),
    (["compare", "standard", "control_block", "--plot", "existing"], "--plot existing is a folder"),
    (["export", "--out", "/proc/x"], "cannot write '/proc/x'"),
    (["report", "--out", "/proc/x.md"], "cannot write '/proc/x.md'"),
])
def test_an_output_that_cannot_be_written_is_one_line_and_nothing_is_written(imported, workdir, capsys, monkeypatch,
                                                                            args, says):
    (workdir / "existing").mkdir()
    before, root = listing(workdir), set(os.listdir("/"))
    code, _, err = in_process(args, capsys, monkeypatch)
    assert code == 2 and one_line(err) and says in err, err
    assert listing(workdir) == before and set(os.listdir("/")) == root  # no existing_figures/, no /_figures


# -- 6. seeds out of range: refused at parse time --------------------------------------------------------
@pytest.mark.parametrize("seed", ["99999999999999999999", "-1", "2147483648"])
def test_a_seed_out_of_range_is_refused_at_parse_time(workdir, capsys, monkeypatch, seed):
    code, _, err = in_process(["launch", "standard", "--seeds", seed], capsys, monkeypatch)
    assert code == 2 and one_line(err) and f"bad --seeds '{seed}': a seed is a whole number from 0 to" in err, err
    assert not (workdir / "runs.db").exists()


def test_the_library_refuses_a_bad_seed_list_too():
    from attnres.runs.planning import request

    for seeds in ([-1], [2**40], [1, 2**31]):
        with pytest.raises(AttnresError, match="a seed is a whole number from 0 to 2147483647"):
            request(["standard"], seeds)
    assert request(["standard"], [0, 2**31 - 1]).seeds == [0, 2**31 - 1]


# -- 7. faults around a run ---------------------------------------------------------------------------
def test_a_checkpoint_folder_deleted_between_or_during_saves_is_made_again(tmp_path, monkeypatch, capfd):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    folder = tmp_path / "checkpoints" / "run-1"
    checkpoint.save(folder, model, opt, 1)
    shutil.rmtree(tmp_path / "checkpoints")  # between two saves
    checkpoint.save(folder, model, opt, 2)
    assert checkpoint.load(folder, model, opt) == 2

    real, calls = torch.save, []

    def cut(obj, fh, *args, **kwargs):  # during a save: the folder goes while its file is being written
        real(obj, fh, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            shutil.rmtree(tmp_path / "checkpoints")

    monkeypatch.setattr(checkpoint.torch, "save", cut)
    checkpoint.save(folder, model, opt, 3)
    monkeypatch.undo()
    assert len(calls) == 2 and checkpoint.load(folder, model, opt) == 3
    assert sorted(os.listdir(folder)) == ["last.pt"]
    assert "was deleted during the save at step 3; writing it again" in capfd.readouterr().err


@pytest.mark.integration
def test_gpus_on_a_cpu_machine_warn_then_the_run_trains_and_a_deleted_log_is_gone(workdir, capsys, monkeypatch):
    from attnres.runs.backends.devices import gpu_driver_loaded, visible_gpus

    if gpu_driver_loaded() and visible_gpus():
        pytest.skip("this machine has GPUs")
    proc = attnres("launch", "standard", "--seeds", "1", "--steps", "4", "--gpus-per-run", "2", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "warning: --gpus-per-run 2: this machine has no GPU, so each run trains on CPU" in proc.stderr
    assert runs(workdir)[0]["status"] == states.FINISHED
    code, out, _ = in_process(["logs", "1"], capsys, monkeypatch)
    assert code == 0 and out
    log = runs(workdir)[0]["log_path"]
    shutil.rmtree(workdir / "logs")
    code, _, err = in_process(["logs", "1"], capsys, monkeypatch)
    assert code == 2 and one_line(err) and f"run 1's log {log} is gone (deleted?)" in err, err


def test_a_queued_run_without_a_log_has_none_yet(workdir, capsys, monkeypatch):
    engine = get_engine(str(workdir / "runs.db"))
    run_rows.create_run(engine, resolve_run("standard", "tiny", 1), log_path=str(workdir / "logs" / "run-1.log"))
    engine.dispose()
    code, _, err = in_process(["logs", "1"], capsys, monkeypatch)
    assert code == 2 and "run 1 has no log yet" in err


@pytest.mark.integration
def test_a_trainer_started_after_its_run_was_killed_leaves_one_line(workdir, capsys, monkeypatch):
    engine = get_engine(str(workdir / "runs.db"))
    run = run_rows.create_run(engine, resolve_run("standard", "tiny", 1, ["steps=4"]))
    engine.dispose()
    code, out, err = in_process(["kill", str(run)], capsys, monkeypatch)
    assert code == 0 and f"killed 1 run(s): {run}" in out, err
    trainer = [sys.executable, "-m", "attnres.train", "--run-id", str(run), "--db", str(workdir / "runs.db")]
    proc = subprocess.run(trainer, capture_output=True, text=True, timeout=300)
    said = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and "Traceback" not in said, said
    assert said == f"attnres: run {run} was killed before its trainer started; nothing to do"
    assert runs(workdir)[0]["status"] == states.KILLED and runs(workdir)[0]["started_at"] is None


@pytest.mark.integration
def test_status_shows_how_long_a_running_run_was_not_heard_from(workdir, capsys, monkeypatch):
    path = workdir / "running.csv"
    path.write_text("variant,seed,step,key,value,status\nstandard,1,10,train_loss,3.0,running\n"
                    "standard,2,10,train_loss,3.0,running\n")
    code, _, err = in_process(["import", str(path)], capsys, monkeypatch)
    assert code == 0, err
    engine = get_engine(str(workdir / "runs.db"))
    run_rows.update_run(engine, 1, heartbeat_at=run_rows.now() - timedelta(minutes=5, seconds=3))
    run_rows.update_run(engine, 2, heartbeat_at=run_rows.now())
    engine.dispose()
    out = attnres("status", check=True).stdout  # (a process of its own: the table at its 200 columns)
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "running (no heartbeat for 5m0" in lines["1"], out
    assert "no heartbeat" not in lines["2"], out


def test_values_too_large_to_average_are_one_line_not_a_mean_of_zero(workdir, capsys, monkeypatch):
    big = {("standard", 1): 1e308, ("standard", 2): -1e308, ("control_block", 1): -1e308, ("control_block", 2): 1e308}
    code, _, err = in_process(["import", str(metric_file(workdir / "big.csv", big, steps=3))], capsys, monkeypatch)
    assert code == 0, err
    for args in (["report", "--out", "big.md"], ["compare", "standard", "control_block"]):
        code, out, err = in_process(args, capsys, monkeypatch)
        assert code == 2 and one_line(err) and "Mean 0.000" not in out + err, err
        assert "eval loss at step 0 is" in err and "too large to average" in err, err
    assert not (workdir / "big.md").exists() and not (workdir / "big_figures").exists()
