"""Fault injection: after each fault, every metric produced before it is in the database or its spool."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap

import psutil
import pytest
from helpers import FAST, LONG, attnres, cli_here, database_at, runs, sha, train_steps, wait_for

from attnres.tracking.db import HEAD
from attnres.tracking.run_rows import metrics_frame

pytestmark = pytest.mark.integration

PG = os.environ.get("ATTNRES_TEST_PG_URL")


WRITER = textwrap.dedent("""
    import sys
    from attnres.config import RunConfig
    from attnres.tracking import run_rows
    from attnres.tracking.db import get_engine
    from attnres.tracking.writer import MetricWriter
    from attnres.variants.registry import resolve_run
    url, n, spool = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    engine = get_engine(url)
    run_id = run_rows.create_run(engine, resolve_run("standard", "tiny", n))
    writer = MetricWriter(engine, run_id, spool, interval=0.05)
    for step in range(5000):
        writer.add(step, a=step * 1.0, b=1.0, c=2.0, d=3.0)
    print("clean" if writer.close(timeout=300) else "spooled")
""")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_eight_concurrent_writers_lose_no_row(workdir, backend, request):
    if backend == "postgresql":
        if not PG:
            pytest.skip("PostgreSQL not started (.ci/services.sh start sets ATTNRES_TEST_PG_URL)")
        url = request.getfixturevalue("pg_url")
    else:
        url = str(workdir / "runs.db")
    from attnres.tracking.db import get_engine

    get_engine(url)  # schema in place before the writers race
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, str(i), str(workdir / f"w{i}.spool")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(8)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [o.strip() for o, _ in outs] == ["clean"] * 8
    assert not any("locked" in e or "failed" in e for _, e in outs)
    frame = metrics_frame(get_engine(url), ["a", "b", "c", "d"])
    print(f"FAULT-TABLE 8 writers {backend}: expected {8 * 5000 * 4} found {len(frame)}")
    assert len(frame) == 8 * 5000 * 4
    assert all(os.path.getsize(workdir / f"w{i}.spool") == 0 for i in range(8))


def test_disk_full_on_the_spool_does_not_stop_training(workdir):
    (workdir / "logs").mkdir()
    os.symlink("/dev/full", workdir / "logs" / "run-1.spool.jsonl")  # every write: ENOSPC
    out = attnres("launch", "standard", "--seeds", "1", "--steps", "12", *FAST, "--set", "log_every=1", check=True)
    assert "run 1: finished" in out.stdout
    assert "cannot write spool" in (workdir / "logs" / "run-1.log").read_text()
    print(f"FAULT-TABLE disk full spool: expected 12 found {len(train_steps(workdir / 'runs.db'))}")
    assert train_steps(workdir / "runs.db") == list(range(1, 13))


def test_rank_failure_fails_the_run_and_keeps_its_rows(workdir):
    cli_here("launch", "standard", "--seeds", "1", "--nproc", "2", "--steps", LONG, *FAST, "--set", "log_every=1",
             "--detach", check=True)
    run = wait_for(lambda: (r := runs(workdir)[0])["status"] == "running" and r["step"] >= 4 and r)
    workers = psutil.Process(run["agent_pid"]).children()
    rank1 = next(p for p in workers if p.pid != run["pid"])
    rank1.kill()
    wait_for(lambda: runs(workdir)[0]["status"] == "failed", timeout=60)
    r = runs(workdir)[0]
    assert r["exit_code"] != 0
    steps = train_steps(workdir / "runs.db")
    print(f"FAULT-TABLE rank failure: status {r['status']} exit {r['exit_code']} expected {max(steps)} "
          f"found {len(steps)}")
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 4


def test_corrupt_database_is_one_line_and_never_overwritten(workdir):
    db = workdir / "runs.db"
    db.write_bytes(b"this is not a database" * 100)
    before = sha(db)
    for args in (["status"], ["report", "--out", "r.md"], ["launch", "standard", "--seeds", "1"]):
        proc = cli_here(*args)  # (its output is the subject: a traceback here fails the test)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "not a database" in proc.stderr
    assert sha(db) == before


def test_locked_database_is_one_line(workdir, monkeypatch):
    db = workdir / "runs.db"
    from attnres.tracking.db import get_engine

    get_engine(str(db)).dispose()  # schema in place, no connection left open here
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    monkeypatch.setenv("ATTNRES_DB_BUSY_TIMEOUT", "1")
    proc = cli_here("launch", "standard", "--seeds", "1", "--steps", "2", *FAST)
    holder.execute("ROLLBACK")
    holder.close()
    assert proc.returncode == 2 and "locked" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_older_schema_is_refused_then_upgraded_keeping_its_runs(workdir):
    db = workdir / "runs.db"
    database_at(db, "0001")
    before = sha(db)
    proc = cli_here("status")
    assert proc.returncode == 2 and "older" in proc.stderr and "attnres db upgrade" in proc.stderr
    assert sha(db) == before
    shutil.copy(db, workdir / "backup.db")
    assert f"0001 -> {HEAD}" in cli_here("db", "upgrade", check=True).stdout
    status = cli_here("status", check=True).stdout
    assert "standard" in status and "finished" in status


def immutable(paths, on: bool) -> None:
    """Make files read-only even for root (chattr), as a read-only mount or volume would."""
    for p in paths:
        if p.exists():
            subprocess.run(["chattr", "+i" if on else "-i", str(p)], check=True, capture_output=True)


@pytest.fixture
def chattr_works(tmp_path):
    probe = tmp_path / "probe"
    probe.write_text("x")
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem cannot make files immutable (chattr +i)")
    immutable([probe], False)


def test_read_only_database_at_launch_is_one_line_and_unchanged(workdir, chattr_works):
    from attnres.tracking.db import get_engine

    db = workdir / "runs.db"
    get_engine(str(db)).dispose()
    files = [db, workdir / "runs.db-wal", workdir / "runs.db-shm"]
    before = sha(db)
    gc.disable()  # (as below)
    immutable(files, True)
    try:
        proc = attnres("launch", "standard", "--seeds", "1", "--steps", "2", *FAST)
    finally:
        immutable(files, False)
        gc.enable()
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "readonly" in proc.stderr.replace("read-only", "readonly")
    assert sha(db) == before


def test_database_made_read_only_mid_run_spools_then_sync_completes(workdir, chattr_works):
    db = workdir / "runs.db"
    trainer = subprocess.Popen([sys.executable, "-m", "attnres.train", "--variant", "standard", "--seed", "1",
                                "--db", str(db), "--set", "steps=30", "--set", "batch_size=4", "--set", "log_every=1",
                                "--set", "eval_every=10", "--set", "eval_batches=2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    files = [db, workdir / "runs.db-wal", workdir / "runs.db-shm"]
    try:
        wait_for(lambda: db.exists() and len(train_steps(db)) >= 3)
        trainer.send_signal(signal.SIGSTOP)
        gc.disable()  # a connection of this process closed meanwhile would write to the immutable -shm (SIGBUS)
        immutable(files, True)
        trainer.send_signal(signal.SIGCONT)
        out, err = trainer.communicate(timeout=300)
    finally:
        immutable(files, False)
        gc.enable()
    assert trainer.returncode == 0, err
    assert "database write failed" in err and "attnres sync" in out
    cli_here("sync", check=True)
    print(f"FAULT-TABLE read-only mid-run: expected 30 found {len(train_steps(db))}")
    assert train_steps(db) == list(range(1, 31))
    with sqlite3.connect(db) as conn:
        assert conn.execute("select status from runs").fetchone() == ("finished",)
