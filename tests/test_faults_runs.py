"""Faults mid-run (a third of the way through the issue's tiny run), with real torchrun processes and real SQLite.

Each ends in one clear, consistent and resumable state, with no metric row lost. FAULT-TABLE lines
are printed for docs/design.md's table (``pytest -s -k faults``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from helpers import (
    BYTES,
    CLI,
    ISSUE_MID,
    ISSUE_ROWS,
    ISSUE_RUN,
    ISSUE_STEPS,
    LONG,
    attnres,
    cli_here,
    issue_run,
    metric_rows,
    queue_pid,
    runs,
    train_steps,
    wait_for,
)

from attnres.runs.backends.local import process_alive

pytestmark = pytest.mark.integration


def at_step(workdir, n: int, run: int = 0) -> dict:
    def there() -> dict | None:
        rows = runs(workdir)
        r = rows[run] if len(rows) > run else None
        return r if r and r["status"] == "running" and r["step"] >= n else None

    return wait_for(there)


def test_database_deleted_mid_run_loses_nothing_and_sync_rebuilds_it(workdir):
    out = cli_here("launch", "standard", "--seeds", "1", *ISSUE_RUN, "--detach", check=True).stdout
    at_step(workdir, ISSUE_MID)
    for suffix in ("", "-wal", "-shm"):
        (workdir / f"runs.db{suffix}").unlink(missing_ok=True)
    wait_for(lambda: not process_alive(queue_pid(out)))  # the queue settled the run and left
    assert (workdir / "logs" / "run-1.spool.jsonl").stat().st_size > 0  # kept: nothing confirmed it
    log = (workdir / "logs" / "run-1.log").read_text()
    assert "database write failed" in log and "attnres sync" in log and "Traceback" not in log  # trained on
    assert not (workdir / "runs.db").exists() or metric_rows(workdir / "runs.db") == 0  # no new empty file
    synced = cli_here("sync", check=True).stdout
    assert "1 run(s) recreated" in synced
    rows = metric_rows(workdir / "runs.db")
    print(f"FAULT-TABLE runs.db deleted mid-run: {rows} of {ISSUE_ROWS} rows after sync, {ISSUE_ROWS - rows} lost")
    assert rows == ISSUE_ROWS and train_steps(workdir / "runs.db") == list(range(1, ISSUE_STEPS + 1))
    r = runs(workdir)[0]
    assert (r["status"], r["step"]) == ("finished", ISSUE_STEPS)


def test_garbled_spool_lines_are_kept_aside_and_every_good_line_is_ingested(workdir):
    out = cli_here("launch", "standard", "--seeds", "1", *ISSUE_RUN, "--detach", check=True).stdout
    at_step(workdir, ISSUE_MID)
    spool = workdir / "logs" / "run-1.spool.jsonl"
    junk = [b"\xff\xfe\xfd not utf-8\n", b'{"r": 1, "s": 7, "k": "train_lo\n',
            b'{"r": 1, "s": "x", "k": "a", "v": 1}\n']
    with spool.open("ab") as fh:
        fh.writelines(junk)
    wait_for(lambda: not process_alive(queue_pid(out)))
    r = runs(workdir)[0]
    rows = metric_rows(workdir / "runs.db")
    print(f"FAULT-TABLE garbled spool: {r['status']}, {rows} of {ISSUE_ROWS} rows, 3 lines kept aside")
    assert (r["status"], rows) == ("finished", ISSUE_ROWS)
    assert (workdir / "logs" / "run-1.spool.jsonl.rejects").read_bytes() == b"".join(junk)
    assert "Traceback" not in (workdir / "logs" / "run-1.log").read_text()
    # attnres sync of a garbled spool file: good lines in, bad ones counted in its one line
    (workdir / "other.spool.jsonl").write_bytes(b'{"r": 1, "s": 1, "k": "x", "v": 1.0}\n' + junk[0])
    done = cli_here("sync", "other.spool.jsonl", check=True)
    assert "1 metric rows, 1 unreadable line(s) skipped" in done.stdout and done.stderr == ""


def test_sigkill_of_torchrun_ends_its_worker_and_the_run_stays_failed(workdir):
    cli_here("launch", "standard", "--seeds", "1", *ISSUE_RUN, "--detach", check=True)
    run = at_step(workdir, ISSUE_MID)
    os.kill(run["agent_pid"], signal.SIGKILL)
    wait_for(lambda: not process_alive(run["pid"]))  # the worker dies with its torchrun
    wait_for(lambda: runs(workdir)[0]["status"] == "failed")
    r = runs(workdir)[0]
    steps = train_steps(workdir / "runs.db")
    print(f"FAULT-TABLE SIGKILL of torchrun: worker ended, run {r['status']} at step {r['step']}, "
          f"{len(steps)} logged steps, none lost")
    assert steps == list(range(1, len(steps) + 1)) and "signal 9" in r["message"]
    out = cli_here("resume", "1", check=True).stdout  # and it resumes
    assert "run 1: finished" in out and train_steps(workdir / "runs.db") == list(range(1, ISSUE_STEPS + 1))


def test_a_long_write_lock_neither_blocks_status_nor_fails_a_live_run(workdir, monkeypatch):
    cli_here("launch", "standard", "--seeds", "1", *issue_run(200), "--detach",
             check=True)
    at_step(workdir, 20)
    holder = sqlite3.connect(workdir / "runs.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process writes for a long time
    try:
        monkeypatch.setenv("ATTNRES_STALE_AFTER_S", "1")  # heartbeats older than 1 s look stale...
        start = time.monotonic()
        status = attnres("status", check=True)
        took = time.monotonic() - start
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    print(f"FAULT-TABLE write lock held: status answered in {took:.1f} s, run shown running")
    assert "running" in status.stdout and took < 20  # it read what it could; it waited on no lock
    assert runs(workdir)[0]["status"] == "running"  # ... and its live worker is not declared dead
    cli_here("kill", "1", check=True)


@pytest.fixture
def small_disk(workdir):
    logs = workdir / "logs"
    logs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(logs)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield logs
    subprocess.run(["umount", "-l", str(logs)], capture_output=True)


def test_disk_full_where_logs_and_spool_live(workdir, small_disk):
    out = cli_here("launch", "standard", "--seeds", "1", *ISSUE_RUN, "--detach", check=True).stdout
    at_step(workdir, ISSUE_MID)
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk / 'fill'}", "bs=64k"], capture_output=True)  # full
    wait_for(lambda: not process_alive(queue_pid(out)))
    r = runs(workdir)[0]
    rows = metric_rows(workdir / "runs.db")
    print(f"FAULT-TABLE disk full (logs, spool): run {r['status']} at {r['step']}/{ISSUE_STEPS}, "
          f"exit {r['exit_code']}, "
          f"{rows} of {ISSUE_ROWS} rows")
    assert (r["status"], r["step"], r["exit_code"], rows) == ("finished", ISSUE_STEPS, 0, ISSUE_ROWS) and r["ended_at"]


def test_a_cut_checkpoint_falls_back_to_the_previous_one(workdir):
    cli_here("launch", "standard", "--seeds", "1", *ISSUE_RUN, "--set", "checkpoint_every=10", "--detach", check=True)
    at_step(workdir, ISSUE_MID)
    cli_here("kill", "1", check=True)
    last = workdir / "checkpoints" / "run-1" / "last.pt"
    last.write_bytes(last.read_bytes()[:2000])
    out = cli_here("resume", "1", check=True).stdout
    log = (workdir / "logs" / "run-1.log").read_text()
    assert "run 1: finished" in out and "is unreadable; continuing from prev.pt" in log
    assert train_steps(workdir / "runs.db") == list(range(1, ISSUE_STEPS + 1))
    print("FAULT-TABLE cut checkpoint: resumed from prev.pt, finished, 0 rows lost")
    cli_here("kill", "--all")
    again = cli_here("resume", "1")
    assert again.returncode == 2 and "only failed, killed, preempted" in again.stderr


def test_resume_with_every_checkpoint_unreadable_refuses_and_keeps_every_row(workdir):
    cli_here("launch", "standard", "--seeds", "3", *issue_run(int(LONG)), *BYTES, "--set", "checkpoint_every=2",
             "--detach", check=True)
    trainer = wait_for(lambda: (rows := runs(workdir)) and rows[0]["step"] >= 6 and rows[0]["pid"]
                       and rows[0]["agent_pid"] and rows[0])
    # no save on the way out, from the trainer or anything it left: the files on disk are the last ones (a CI run
    # once saw a trainer save on to step 188 after its SIGKILL, overwriting the damage, and the resume below trained on)
    for pid in (trainer["pid"], trainer["agent_pid"]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not process_alive(trainer["pid"]) and not process_alive(trainer["agent_pid"]))
    wait_for(lambda: runs(workdir)[0]["status"] in ("failed", "killed"))
    folder = workdir / "checkpoints" / "run-1"
    for name in ("last.pt", "prev.pt"):
        (folder / name).write_bytes(os.urandom(4096))
    rows, steps = metric_rows(workdir / "runs.db"), train_steps(workdir / "runs.db")
    assert rows and steps
    for _ in range(2):  # refused again, the same way: nothing was changed by the first refusal
        refused = cli_here("resume", "1", "--detach")  # (were it not refused, a run of its own, not this worker's)
        assert refused.returncode == 2, refused
        assert len(refused.stderr.strip().splitlines()) == 1 and "--restart 1" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        assert (metric_rows(workdir / "runs.db"), train_steps(workdir / "runs.db")) == (rows, steps)
        assert runs(workdir)[0]["status"] in ("failed", "killed")
    restarted = cli_here("resume", "1", "--restart", "--detach", check=True)
    assert "starting over from step 0" in restarted.stdout
    assert (workdir / "checkpoints" / "run-1.restart-1" / "last.pt").read_bytes() != b""  # the damaged files, kept
    wait_for(lambda: runs(workdir)[0]["status"] == "running" and len(train_steps(workdir / "runs.db")) >= 2)
    cli_here("kill", "1", check=True)


def test_restart_sets_a_killed_runs_checkpoints_aside_and_starts_it_over(workdir):
    # The run is too long to finish, so the kill always finds it going however fast the machine.
    cli_here("launch", "standard", "--seeds", "2", *issue_run(int(LONG)), *BYTES, "--set", "checkpoint_every=2",
             "--detach", check=True)
    wait_for(lambda: runs(workdir) and runs(workdir)[0]["step"] >= 5)
    cli_here("kill", "1", check=True)
    with sqlite3.connect(workdir / "runs.db") as conn:  # a row the restarted run cannot have written yet
        conn.execute("insert into metrics (run_id, key_id, step, value) select 1, id, 99999, 0.0 from metric_keys "
                     "where name = 'train_loss'")
    restarted = cli_here("resume", "1", "--restart", "--detach", check=True)
    assert 99999 not in train_steps(workdir / "runs.db", 1), restarted.stdout
    assert (workdir / "checkpoints" / "run-1.restart-1" / "last.pt").is_file()
    wait_for(lambda: runs(workdir)[0]["status"] == "running" and len(train_steps(workdir / "runs.db", 1)) >= 3)
    steps = train_steps(workdir / "runs.db", 1)
    assert steps == list(range(1, len(steps) + 1))  # from step 1 again
    cli_here("kill", "1", check=True)


def test_ctrl_c_on_a_foreground_grid_preempts_it_and_a_relaunch_continues_it(workdir):
    args = ["launch", "standard", "--seeds", "1", "2", *ISSUE_RUN, "--set", f"checkpoint_every={ISSUE_MID}"]
    # as from a terminal: SIGINT handled even when the suite itself runs as a background job (which ignores it)
    cli = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=os.environ | {"COLUMNS": "200"},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = at_step(workdir, ISSUE_MID + 2)
    cli.send_signal(signal.SIGINT)
    out, err = cli.communicate(timeout=300)
    assert cli.returncode == 130, (out, err)
    assert err.strip().count("\n") == 0 and "stopped: run 1 preempted, run 2 preempted" in err
    assert "attnres resume 1 2" in err
    r1, r2 = runs(workdir)
    assert (r1["status"], r2["status"], r2["started_at"]) == ("preempted", "preempted", None)
    assert not process_alive(first["pid"]) and (workdir / "checkpoints" / "run-1" / "last.pt").exists()
    again = cli_here(*args, check=True).stdout  # (the relaunch's own process is not the subject)
    assert "resume run 1" in again and "resume run 2" in again and "run 2: finished" in again
    assert [train_steps(workdir / "runs.db", r) for r in (1, 2)] == [list(range(1, ISSUE_STEPS + 1))] * 2
    print("FAULT-TABLE Ctrl-C on a foreground grid: 2 runs preempted, relaunch finished both, 0 rows lost")


def test_a_second_queue_waits_for_the_machines_one_cpu_slot(workdir):
    cli_here("launch", "standard", "--seeds", "7", *issue_run(10), check=True)
    cli_here("kill", "--all")
    with sqlite3.connect(workdir / "runs.db") as conn:  # a finished run made resumable, as a killed one is
        conn.execute("update runs set status = 'killed'")
    # long enough to be seen going: its step reaches the database every 2 s (80 steps took 1.8 s on a fast CPU)
    first = cli_here("launch", "standard", "--seeds", "8", *issue_run(200), "--detach",
                     check=True)
    at_step(workdir, 5, run=1)
    second = cli_here("resume", "1", "--detach", check=True)
    wait_for(lambda: not process_alive(queue_pid(second.stdout)) and not process_alive(queue_pid(first.stdout)))
    a, b = runs(workdir)[1], runs(workdir)[0]
    print("FAULT-TABLE second queue on a CPU machine: ran after the first, never beside it")
    assert (a["status"], b["status"]) == ("finished", "finished") and b["started_at"] >= a["ended_at"]


ENQUEUE_AT_ONCE = """
import sys, time
from pathlib import Path
from attnres.runs import orchestrator
from attnres.runs import planning
from attnres.tracking.run_store import RunStore
url, seed, go, ready = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
store = RunStore(url)
req = planning.request(["standard", "control_block"], [seed])
cells = planning.plan(store, req)  # both planners see no run of this grid ...
ready.touch()
while not go.exists():  # ... and are released together
    time.sleep(0.001)
print(orchestrator.enqueue(store, cells, req))
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_launches_of_one_grid_at_the_same_moment_queue_each_cell_once(workdir, backend, request):
    url = request.getfixturevalue("pg_url") if backend == "postgresql" else str(workdir / "runs.db")
    from attnres.tracking.run_store import RunStore

    store = RunStore(url)  # the schema in place before the planners race
    # (each trial is a real race: without the guard, both planners queue the grid in nearly every one;
    # ATTNRES_TEST_TRIALS=20 for the long form)
    trials = int(os.environ.get("ATTNRES_TEST_TRIALS", "4"))
    for trial in range(trials):
        go, ready = workdir / f"go-{trial}", [workdir / f"ready-{trial}-{i}" for i in range(2)]
        procs = [subprocess.Popen([sys.executable, "-c", ENQUEUE_AT_ONCE, url, str(1000 + trial), str(go), str(r)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in ready]
        wait_for(lambda ready=ready: all(r.exists() for r in ready))  # both planned: neither saw the other's runs
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
    frame = store.runs_frame()
    per_cell = frame.groupby("config_hash").size()
    print(f"FAULT-TABLE two launches at once ({backend}): {trials} trials, {len(frame)} runs for "
          f"{len(per_cell)} cells, duplicates {int((per_cell > 1).sum())}")
    assert len(frame) == trials * 2 and (per_cell == 1).all()
