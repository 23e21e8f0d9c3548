"""The store object: the one door to the database for everything outside attnres/tracking/."""

from __future__ import annotations

import dataclasses

import pytest

from attnres.errors import AttnresError
from attnres.tracking import states
from attnres.tracking.records import RunRecord
from attnres.tracking.run_store import RunStore
from attnres.tracking.schema import Run
from attnres.variants.registry import resolve_run


def test_a_run_record_has_exactly_the_columns_of_the_runs_table():
    assert [f.name for f in dataclasses.fields(RunRecord)] == [c.name for c in Run.__table__.columns]


def test_a_store_returns_plain_frozen_records_that_outlive_their_read(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    cfg = resolve_run("standard", "tiny", 7, ["steps=50"])
    rid = store.create_run(cfg, log_path=str(tmp_path / "run.log"))
    run = store.run(rid)
    assert isinstance(run, RunRecord) and not isinstance(run, Run)
    assert (run.variant, run.seed, run.status, run.total_steps) == ("standard", 7, states.QUEUED, 50)
    assert run.spool == tmp_path / "run.spool.jsonl"
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = states.RUNNING  # a record changes nothing: the store's methods do
    assert store.move(rid, states.KILLED, states.USER, ended_at=states.now())
    assert run.status == states.QUEUED and store.run(rid).status == states.KILLED  # read again: as recorded now
    assert [r.id for r in store.active_runs()] == []
    with pytest.raises(AttnresError, match="no run with id 99"):
        store.run(99)


def test_the_status_listing_and_the_frames_agree(tmp_path):
    store = RunStore(str(tmp_path / "runs.db"))  # a plain path is a SQLite file
    ids = [store.create_run(resolve_run("standard", "tiny", s, ["steps=10"])) for s in (1, 2)]
    rows, total = store.status_runs()
    assert total == 2 and sorted(int(r["id"]) for r in rows) == ids
    assert list(store.runs_frame()["id"]) == ids
    assert store.any_active()


def test_the_default_database_is_known(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_DB", str(tmp_path / "default.db"))
    assert RunStore().is_default
    assert not RunStore(str(tmp_path / "other.db")).is_default
