"""A spool lost mid-run (its file or its logs folder deleted, or replaced): the writer notices within a
second, makes it again holding everything the database has not confirmed, and a crash then loses nothing.
In process on a real SQLite file, then with real trainer processes (issue 34, item 2)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import FAST, LONG, cli_here, runs, train_steps, wait_for
from sqlalchemy.exc import OperationalError

from attnres.runs.backends.local import process_alive
from attnres.tracking import run_rows, spool, spool_file, states
from attnres.tracking.db import get_engine
from attnres.tracking.records import RunRecord
from attnres.tracking.writer import MetricWriter
from attnres.variants.registry import resolve_run


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    monkeypatch.setattr(spool_file, "CHECK_S", 0.0)  # every write looks (the trainer's writer: once a second)
    return get_engine(str(tmp_path / "runs.db"))


def started(engine) -> MetricWriter:
    """A run's writer as its trainer starts it, whose background thread writes only when told (flush)."""
    run = run_rows.create_run(engine, resolve_run("standard", "tiny", 1))
    w = MetricWriter(engine, run, RunRecord.of(run_rows.get_run(engine, run)).spool, interval=3600.0)
    w.keep_snapshot(run_rows.run_fields(engine, run))
    w.transition(states.RUNNING, pid=os.getpid())
    assert w.flush()
    return w


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_deleted_logs_folder_is_made_again_with_what_the_database_lacks(engine, tmp_path, capsys):
    w = started(engine)
    for step in (1, 2):
        w.add(step, train_loss=10.0 - step)
    assert w.flush()  # steps 1 and 2 are in the database
    w.add(3, train_loss=7.0)
    w.drop_after(2)  # a resume point the database has not taken yet
    w.add(3, train_loss=6.5)
    w.update_run(message="going")
    shutil.rmtree(tmp_path / "logs")  # the folder, its spool and the values of step 3 in it
    w.add(4, train_loss=6.0)
    assert w.spool.exists()
    kept = lines(w.spool)
    assert kept[0]["snapshot"]["status"] == states.RUNNING and kept[0]["snapshot"]["config_hash"]
    assert kept[1:] == [{"run": w.run_id, "drop_after": 2}, {"r": w.run_id, "s": 3, "m": {"train_loss": 6.5}},
                        {"run": w.run_id, "fields": {"message": "going"}},
                        {"r": w.run_id, "s": 4, "m": {"train_loss": 6.0}}]  # not steps 1, 2: confirmed
    assert "was deleted or replaced; made it again with the 1 value(s)" in capsys.readouterr().err
    # the new spool alone gives the database what it lacks
    spool.ingest(engine, w.spool, truncate=False)
    assert run_rows.metrics_frame(engine, ["train_loss"], [w.run_id]).set_index("step")["value"].to_dict() == {
        1: 9.0, 2: 8.0, 3: 6.5, 4: 6.0}
    assert w.close() and w.spool.stat().st_size == 0  # confirmed at the end, then emptied as usual
    assert sorted(run_rows.metrics_frame(engine, ["train_loss"], [w.run_id])["step"]) == [1, 2, 3, 4]


def test_a_replaced_spool_gets_the_pending_lines_and_a_deleted_database_is_rebuilt_from_it(engine, tmp_path):
    w = started(engine)
    w.add(1, train_loss=5.0)
    assert w.flush()
    w.add(2, train_loss=4.0)
    w.add(3, train_loss=3.0)
    w.spool.rename(tmp_path / "old.jsonl")  # (a restore from a backup, a copy over it): another file at the path
    w.spool.write_text("")
    w.progress(3)  # a progress mark alone waits for the next line handed out
    w.update_run(message="x")
    got = lines(w.spool)
    assert got[0]["snapshot"]["step"] == 3
    assert [g["s"] for g in got if "r" in g] == [2, 3]
    fresh = get_engine(str(tmp_path / "fresh.db"))  # a database that lost the run: the snapshot recreates it
    assert spool.ingest(fresh, w.spool, truncate=False)["runs"] == 1
    assert run_rows.get_run(fresh, w.run_id).status == states.RUNNING
    assert sorted(run_rows.metrics_frame(fresh, ["train_loss"], [w.run_id])["step"]) == [2, 3]
    w.close()


def test_what_is_being_written_to_the_database_when_the_spool_goes_is_written_again(engine, tmp_path, monkeypatch):
    """The background thread took steps 1 and 2 and is writing them when the spool goes; the write then fails:
    the new spool must hold them (they are neither pending nor in the database)."""
    w = started(engine)
    entered, go = threading.Event(), threading.Event()
    real = run_rows.log_steps

    def slow_then_refused(*args, **kwargs):
        if entered.is_set():
            return real(*args, **kwargs)
        entered.set()
        go.wait(30)
        raise OperationalError("insert", {}, Exception("disk I/O error"))

    monkeypatch.setattr(run_rows, "log_steps", slow_then_refused)
    w.add(1, train_loss=2.0)
    w.add(2, train_loss=1.5)
    w.wake.set()
    assert entered.wait(30)
    w.spool.unlink()
    w.add(3, train_loss=1.0)  # the training thread notices
    w.idle.clear()
    go.set()  # the write fails: steps 1 and 2 wait again, for the next one
    assert w.idle.wait(30) and w.failures == 1
    assert [g["s"] for g in lines(w.spool) if "r" in g] == [1, 2, 3]
    assert w.close()
    assert sorted(run_rows.metrics_frame(engine, ["train_loss"], [w.run_id])["step"]) == [1, 2, 3]


def test_a_logs_folder_that_cannot_be_made_again_does_not_stop_the_run(engine, tmp_path, capsys):
    w = started(engine)
    w.add(1, train_loss=2.0)
    shutil.rmtree(tmp_path / "logs")
    (tmp_path / "logs").write_text("not a folder")  # (as a read-only disk: mkdir fails)
    w.add(2, train_loss=1.0)
    w.add(3, train_loss=0.5)
    assert not w.spool_ok and "cannot write spool" in capsys.readouterr().err
    assert w.close()  # the database took it all
    assert sorted(run_rows.metrics_frame(engine, ["train_loss"], [w.run_id])["step"]) == [1, 2, 3]


def what_the_trainer_says(workdir) -> str:
    """The run's row and the end of its (deleted) log, read through the trainer's stdout: why a wait failed."""
    run = runs(workdir)[0]
    try:
        tail = Path(f"/proc/{run['pid']}/fd/1").read_text()[-2000:]
    except OSError as exc:
        tail = f"(no log: {exc})"
    return f"status {run['status']} step {run['step']} pid {run['pid']}; logs {sorted(os.listdir(workdir))}; {tail}"


def a_checkpoint_past_the_database(workdir, db) -> None:
    """Wait for the moment a crash costs most: a checkpoint saved after the writer's last database write, so
    the steps up to it are in the spool only (a resume starts from the checkpoint, past them)."""
    checkpoint = workdir / "checkpoints" / "run-1" / "last.pt"

    def now() -> bool:
        seen = len(train_steps(db))
        wait_for(lambda: len(train_steps(db)) > seen or runs(workdir)[0]["status"] != "running")
        if runs(workdir)[0]["status"] != "running":
            return True  # (over already: the test says so)
        wrote, held = time.time(), len(train_steps(db))  # the writer wrote just now (it writes every 2 s)
        while len(train_steps(db)) == held:  # until its next write
            if checkpoint.exists() and checkpoint.stat().st_mtime > wrote:
                return True
            time.sleep(0.02)
        return False

    wait_for(now, timeout=120, every=0)


@pytest.mark.integration
def test_logs_deleted_then_a_sigkill_then_resume_leaves_no_hole(workdir):
    """The issue's sequence: logs folder deleted mid-run, trainer and torchrun SIGKILLed after, resume.

    The run is one that cannot finish on its own (a fast machine would end a short one before the folder
    goes); the resumed attempt is stopped by `attnres kill` well past the crash, and every logged step
    from the first to its last must be in the database.
    """
    cli_here("launch", "standard", "--seeds", "1", "--steps", LONG, *FAST, "--detach", check=True)
    db, spool_file = workdir / "runs.db", workdir / "logs" / "run-1.spool.jsonl"
    wait_for(lambda: len(train_steps(db)) >= 10)
    shutil.rmtree(workdir / "logs")
    try:
        wait_for(spool_file.exists)  # the writer made it again
    except AssertionError:
        raise AssertionError(f"no spool made again: {what_the_trainer_says(workdir)}") from None
    a_checkpoint_past_the_database(workdir, db)  # and it goes on, writing to the database; then the crash
    run = runs(workdir)[0]
    assert run["status"] == "running"
    for pid in (run["pid"], run["agent_pid"]):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not process_alive(run["pid"]))
    wait_for(lambda: runs(workdir)[0]["status"] == "failed")
    crashed_at = max(train_steps(db))
    cli_here("resume", "1", "--detach", check=True)
    wait_for(lambda: runs(workdir)[0]["status"] == "running" and max(train_steps(db)) >= crashed_at + 40)
    cli_here("kill", "1", check=True)
    wait_for(lambda: runs(workdir)[0]["status"] == "killed")
    steps = train_steps(db)
    print(f"FAULT-TABLE logs folder deleted, then SIGKILL at step {crashed_at}: spool made again, resumed to "
          f"step {steps[-1]}, {steps[-1] // 2 - len(steps)} logged steps missing")
    assert steps == list(range(2, steps[-1] + 1, 2))
