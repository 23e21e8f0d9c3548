"""The trainer's metric writer and the spool, in process, on real SQLite files: retry, replay, rebuild."""

from __future__ import annotations

import json
import sqlite3

import pytest
from helpers import values, wait_for

from attnres.errors import AttnresError
from attnres.tracking import run_rows, spool, states
from attnres.tracking.db import forget_engines, get_engine
from attnres.tracking.writer import MetricWriter
from attnres.variants.registry import resolve_run


@pytest.fixture
def engine(tmp_path):
    return get_engine(str(tmp_path / "runs.db"))


def queued(engine) -> int:
    return run_rows.create_run(engine, resolve_run("standard", "tiny", 1))


def test_the_spool_holds_the_whole_run_until_the_writer_closes_with_everything_confirmed(engine, tmp_path):
    run = queued(engine)
    writer = MetricWriter(engine, run, tmp_path / "run.spool.jsonl", interval=0.05)
    writer.keep_snapshot(run_rows.run_fields(engine, run))
    writer.transition(states.RUNNING, pid=123)
    for step in range(1, 51):
        writer.add(step, train_loss=1.0 / step, lr=0.1)
    writer.update_run(step=50)
    assert writer.flush()  # in the database, and still on disk while the run is active
    assert len((tmp_path / "run.spool.jsonl").read_text().splitlines()) == 1 + 1 + 50 + 1  # a line per logged step
    writer.transition(states.FINISHED, exit_code=0)
    assert writer.close()
    assert values(engine, run, "train_loss") == {s: 1.0 / s for s in range(1, 51)}
    r = run_rows.get_run(engine, run)
    assert (r.status, r.step, r.pid, r.exit_code) == (states.FINISHED, 50, 123, 0)
    assert (tmp_path / "run.spool.jsonl").stat().st_size == 0


def test_a_locked_database_is_retried_and_loses_nothing(engine, tmp_path, monkeypatch):
    run = queued(engine)
    db = tmp_path / "runs.db"
    holder = sqlite3.connect(db, isolation_level=None, timeout=1)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    monkeypatch.setenv("ATTNRES_DB_BUSY_TIMEOUT", "0.2")
    forget_engines()
    locked = get_engine(str(db))
    writer = MetricWriter(locked, run, tmp_path / "run.spool.jsonl", interval=0.05)
    writer.transition(states.RUNNING)
    for step in range(1, 101):
        writer.add(step, train_loss=float(step))
    wait_for(lambda: writer.failures >= 2, timeout=60)
    assert not writer.flush(timeout=5)  # not in the database yet ...
    assert len((tmp_path / "run.spool.jsonl").read_text().splitlines()) == 101  # ... but on disk
    holder.execute("ROLLBACK")
    holder.close()
    assert writer.close(timeout=60)
    assert values(engine, run, "train_loss") == {s: float(s) for s in range(1, 101)}
    assert run_rows.status_of(engine, run) == states.RUNNING
    forget_engines()


def test_a_late_end_from_the_trainer_never_undoes_a_kill(engine, tmp_path):
    run = queued(engine)
    writer = MetricWriter(engine, run, tmp_path / "run.spool.jsonl", interval=0.05)
    writer.transition(states.RUNNING)
    assert writer.flush()
    assert states.transition(engine, run, states.KILLED, states.USER, message="killed by attnres kill")
    writer.transition(states.FAILED, message="KeyboardInterrupt")
    writer.add(3, train_loss=1.0)
    writer.close()
    r = run_rows.get_run(engine, run)
    assert (r.status, r.message) == (states.KILLED, "killed by attnres kill")
    assert writer.refused == [(states.FAILED, states.KILLED)]
    assert values(engine, run, "train_loss") == {3: 1.0}  # its values are still kept


def write_spool(path, lines: list[object]) -> None:
    with path.open("wb") as fh:
        for line in lines:
            fh.write(line if isinstance(line, bytes) else (json.dumps(line) + "\n").encode())


def test_ingest_replays_changes_in_order_and_twice_is_once(engine, tmp_path):
    run = queued(engine)
    path = tmp_path / "s.jsonl"
    write_spool(path, [{"run": run, "fields": {"status": states.RUNNING, "pid": 7}},
                       *({"r": run, "s": s, "k": "eval_loss", "v": 10.0 - s} for s in range(5)),
                       {"run": run, "fields": {"step": 4}},
                       {"run": run, "fields": {"status": states.FINISHED, "exit_code": 0}}])
    got = spool.ingest(engine, path, truncate=False)
    assert got == {"rows": 5, "runs": 0, "skipped": 0, "refused": 0}
    again = spool.ingest(engine, path)
    assert again["rows"] == 5 and path.stat().st_size == 0
    assert values(engine, run, "eval_loss") == {s: 10.0 - s for s in range(5)}
    r = run_rows.get_run(engine, run)
    assert (r.status, r.step, r.pid, r.exit_code) == (states.FINISHED, 4, 7, 0)


def test_ingest_skips_unreadable_lines_and_keeps_every_good_one(engine, tmp_path):
    run = queued(engine)
    path = tmp_path / "s.jsonl"
    write_spool(path, [{"r": run, "s": 1, "k": "a", "v": 1.0}, b"\xff\xfe not utf-8\n", b'{"r": 1, "s": 2, "k"\n',
                       {"r": run, "s": "x", "k": "a", "v": 1.0}, {"r": run, "s": 3, "k": "a", "v": 3.0}])
    got = spool.ingest(engine, path)
    assert got["skipped"] == 3 and values(engine, run, "a") == {1: 1.0, 3: 3.0}


def test_a_lost_database_is_rebuilt_from_the_snapshot_and_what_followed(tmp_path):
    first = get_engine(str(tmp_path / "a.db"))
    run = queued(first)
    path = tmp_path / "s.jsonl"
    snap = run_rows.run_fields(first, run)
    write_spool(path, [{"run": run, "snapshot": spool._jsonable(snap)},
                       {"run": run, "fields": {"status": states.RUNNING}},
                       {"r": run, "s": 1, "k": "train_loss", "v": 2.5},
                       {"run": run, "fields": {"step": 1, "status": states.FINISHED}}])
    fresh = get_engine(str(tmp_path / "b.db"))
    got = spool.ingest(fresh, path)
    assert got["runs"] == 1 and got["rows"] == 1
    r = run_rows.get_run(fresh, run)
    assert (r.id, r.variant, r.status, r.step) == (run, "standard", states.FINISHED, 1)
    assert r.config_hash == snap["config_hash"]
    assert values(fresh, run, "train_loss") == {1: 2.5}


def test_a_spool_is_never_emptied_into_a_deleted_database_file(tmp_path):
    db = tmp_path / "runs.db"
    engine = get_engine(str(db))
    run = queued(engine)
    path = tmp_path / "s.jsonl"
    with engine.connect():  # a pooled connection keeps the file open, as a long-lived queue process does
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / f"runs.db{suffix}").unlink(missing_ok=True)
        write_spool(path, [{"run": run, "snapshot": {"config_hash": "x"}}, {"r": run, "s": 1, "k": "a", "v": 1.0}])
        before = path.read_bytes()
        with pytest.raises(AttnresError, match=r"gone.*kept"):
            spool.ingest(engine, path)
    assert path.read_bytes() == before and not db.exists()
    forget_engines()


def test_garbled_lines_are_kept_aside_when_the_spool_is_emptied(engine, tmp_path):
    run = queued(engine)
    path = tmp_path / "s.jsonl"
    junk = [b"\xff\xfe not utf-8\n", b'{"r": 1, "s": 2, "k"\n']
    write_spool(path, [{"r": run, "s": 1, "k": "a", "v": 1.0}, *junk])
    assert spool.ingest(engine, path)["skipped"] == 2
    assert path.stat().st_size == 0 and spool.rejects_of(path).read_bytes() == b"".join(junk)


def test_a_spool_of_another_databases_run_is_refused(engine, tmp_path):
    run = queued(engine)
    path = tmp_path / "s.jsonl"
    write_spool(path, [{"run": run, "snapshot": {"config_hash": "0123456789ab"}},
                       {"r": run, "s": 1, "k": "a", "v": 1.0}])
    with pytest.raises(AttnresError, match="another run"):
        spool.ingest(engine, path)
    assert values(engine, run, "a") == {} and path.stat().st_size > 0


def test_ingest_counts_what_it_refuses_and_skips_statuses_a_trainer_never_sets(engine, tmp_path):
    run = queued(engine)
    states.transition(engine, run, states.KILLED, states.USER)
    path = tmp_path / "s.jsonl"
    write_spool(path, [{"run": run, "fields": {"status": states.QUEUED}},  # not the trainer's to set
                       {"run": run, "fields": {"status": states.FINISHED, "step": 9}}])
    got = spool.ingest(engine, path)
    assert (got["refused"], got["skipped"]) == (1, 1)
    r = run_rows.get_run(engine, run)
    assert (r.status, r.step) == (states.KILLED, 0)  # the refused end's columns did not come either


def test_a_resume_point_in_the_spool_drops_the_stale_values_before_the_new_ones(engine, tmp_path):
    run = queued(engine)
    run_rows.log_metrics(engine, run, [(s, "a", 1.0) for s in range(1, 11)])  # the first attempt, to step 10
    path = tmp_path / "s.jsonl"
    write_spool(path, [*({"r": run, "s": s, "k": "a", "v": 1.0} for s in range(8, 11)),  # its unflushed tail
                       {"run": run, "drop_after": 6},  # the second attempt resumed from step 6 ...
                       *({"r": run, "s": s, "k": "a", "v": 2.0} for s in range(7, 9))])  # ... and got to 8
    spool.ingest(engine, path)
    assert values(engine, run, "a") == {**dict.fromkeys(range(1, 7), 1.0), 7: 2.0, 8: 2.0}


def test_a_spool_from_before_snapshot_lines_still_rebuilds_its_run(tmp_path):
    first = get_engine(str(tmp_path / "a.db"))
    run = queued(first)
    path = tmp_path / "s.jsonl"
    write_spool(path, [{"run": run, "fields": spool._jsonable(run_rows.run_fields(first, run))},  # the old format
                       {"r": run, "s": 1, "k": "a", "v": 1.0}])
    fresh = get_engine(str(tmp_path / "b.db"))
    assert spool.ingest(fresh, path)["runs"] == 1 and values(fresh, run, "a") == {1: 1.0}


def test_a_spool_cut_mid_line_by_a_kill_loses_only_that_line(engine, tmp_path):
    run = queued(engine)
    path = tmp_path / "run.spool.jsonl"
    path.write_text(json.dumps({"r": run, "s": 1, "m": {"a": 1.0}}) + "\n" + '{"run": 1, "fields": {"st')  # killed
    writer = MetricWriter(engine, run, path, interval=3600)  # the next attempt appends to the same spool
    writer.add(2, a=2.0)
    logs, bad = spool.read(path)
    assert [(s, k) for s, k, _ in logs[run].metrics] == [(1, "a"), (2, "a")] and len(bad) == 1
    assert writer.close()
    assert values(engine, run, "a") == {1: 1.0, 2: 2.0}


def test_the_default_database_is_resolved_at_each_call(tmp_path, monkeypatch):
    """A long-lived process (a notebook, the tests) that changes $ATTNRES_DB or its folder gets the new
    database's engine, never the first one's."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        monkeypatch.delenv("ATTNRES_DB", raising=False)
        run_rows.create_run(get_engine(), resolve_run("standard", "tiny", 1 if name == "a" else 2))
    seeds = {name: list(run_rows.runs_frame(get_engine(str(tmp_path / name / "runs.db")))["seed"]) for name in "ab"}
    assert seeds == {"a": [1], "b": [2]}


def test_a_batch_of_steps_logging_different_keys_records_each_value_once_under_its_key(engine):
    run = queued(engine)
    entries = [(s, {"train_loss": 1.0 / s, "lr": 0.1 * s}) for s in range(1, 7)]
    entries[2:2] = [(0, {"eval_loss": 9.0})]  # an eval between train steps: another set of keys
    entries.append((6, {"eval_loss": 4.0, "train_loss": 99.0}))  # a key again at a step it has: the first stays
    entries.append((7, {"lr": 0.7, "train_loss": 1 / 7}))  # the same keys in another order
    assert run_rows.log_steps(engine, run, entries) == 2 * 6 + 1 + 2 + 2
    assert values(engine, run, "train_loss") == {s: 1.0 / s for s in range(1, 8)}
    assert values(engine, run, "lr") == {s: 0.1 * s for s in range(1, 7)} | {7: 0.7}
    assert values(engine, run, "eval_loss") == {0: 9.0, 6: 4.0}
