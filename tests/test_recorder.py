"""Rank 0's bookkeeping in process, on a real SQLite file: start, early-stop verdict, every end."""

from __future__ import annotations

import json

import pytest

from attnres.errors import AttnresError
from attnres.tracking import states
from attnres.tracking.run_store import RunStore
from attnres.training.loop import Ending
from attnres.training.recorder import RunRecorder
from attnres.variants.registry import resolve_run


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    return RunStore(str(tmp_path / "runs.db"))


def queued(store, variant: str = "full_attnres", rule: dict | None = None) -> int:
    run = store.create_run(resolve_run(variant, "tiny", 1))
    store.update_run(run, rule_json=json.dumps(rule) if rule else None)
    return run


def test_a_started_run_is_running_with_its_process_and_a_snapshot_in_its_spool(store):
    run = queued(store)
    rec = RunRecorder(store, run, world_size=2)
    assert rec.writer.flush()
    r = store.run(run)
    assert (r.status, r.world_size) == (states.RUNNING, 2) and r.pid and r.host and r.started_at
    head = json.loads(rec.writer.spool.read_text().splitlines()[0])
    assert head["snapshot"]["config_hash"] == r.config_hash
    assert rec.finish(Ending(states.FINISHED, 12))
    r = store.run(run)
    assert (r.status, r.step, r.exit_code) == (states.FINISHED, 12, 0) and r.ended_at


def test_the_early_stop_rule_compares_with_the_baselines_mean_at_its_step(store):
    for seed, value in [(1, 3.0), (2, 3.2)]:
        base = store.create_run(resolve_run("standard", "tiny", seed), actor=states.IMPORTER,
                                status=states.FINISHED)
        store.log_metrics(base, [(10, "eval_loss", value)])
    other = store.create_run(resolve_run("standard", "tiny", 3, ["steps=50"]), actor=states.IMPORTER,
                             status=states.FINISHED)  # another step budget (another schedule): not a baseline
    store.log_metrics(other, [(10, "eval_loss", 9.9)])
    rec = RunRecorder(store, queued(store, rule={"baseline": "standard", "by": 0.1, "at_step": 10}))
    assert rec.verdict(10, 3.15) is None  # mean 3.1 + 0.1 is not exceeded
    assert rec.verdict(5, 9.0) is None  # not the rule's step
    why = rec.verdict(10, 3.5)
    assert "3.500 is worse than standard's 3.100 by more than 0.1 at step 10" in why
    rec.finish(Ending(states.STOPPED, 10, why))
    r = store.run(rec.run_id)
    assert (r.status, r.stop_step, r.message) == (states.STOPPED, 10, why)


@pytest.mark.parametrize("ending,expect", [
    (Ending(states.DIVERGED, 7, "non-finite loss or gradient at step 7"), (states.DIVERGED, 7, 7, True)),
    (Ending(states.PREEMPTED, 4, "SIGTERM: checkpoint saved"), (states.PREEMPTED, 4, None, False)),
])
def test_early_ends_record_their_step_and_why(store, ending, expect):
    rec = RunRecorder(store, queued(store))
    rec.finish(ending)
    r = store.run(rec.run_id)
    assert (r.status, r.step, r.stop_step, r.ended_at is not None) == expect and r.message == ending.message


def test_an_exception_fails_the_run_with_its_message(store):
    rec = RunRecorder(store, queued(store))
    rec.fail(RuntimeError("out of memory"))
    r = store.run(rec.run_id)
    assert (r.status, r.exit_code, r.message) == (states.FAILED, 1, "RuntimeError: out of memory")


def test_an_end_after_a_kill_is_not_recorded_and_says_so(store, capsys):
    rec = RunRecorder(store, queued(store))
    assert rec.writer.flush()
    store.move(rec.run_id, states.KILLED, states.USER, message="killed by attnres kill")
    rec.finish(Ending(states.FINISHED, 12))
    assert store.run(rec.run_id).message == "killed by attnres kill"
    assert "was already killed: its change to finished is not recorded" in capsys.readouterr().out


def test_a_run_killed_before_its_trainer_starts_is_not_trained(store):
    run = queued(store)
    store.move(run, states.KILLED, states.USER)
    with pytest.raises(AttnresError, match=f"run {run} was killed before its trainer started; nothing to do"):
        RunRecorder(store, run)
    assert store.status_of(run) == states.KILLED


def test_a_resumed_run_writes_the_uninterrupted_curve_to_the_database(store, workdir):
    """SIGTERM-style stop at step 3, then a second attempt from the checkpoint: the database holds
    exactly the values of an uninterrupted run, stale ones past the checkpoint dropped first."""
    from attnres.training.distributed import single
    from attnres.training.loop import Preemption, train

    cfg = resolve_run("standard", "tiny", 5, ["batch_size=2", "eval_batches=1", "warmup=2", "log_every=1",
                                              "steps=8", "eval_every=2", "checkpoint_every=3"])
    whole, part = (store.create_run(c) for c in (cfg, resolve_run("standard", "tiny", 6, [])))
    store.update_run(part, config_json=cfg.to_json())
    first = RunRecorder(store, whole)
    first.finish(train(cfg, single(), first, workdir / "a"))
    store.log_metrics(part, [(s, "train_loss", 99.0) for s in range(4, 9)])  # stale, from a lost attempt
    flag = Preemption()
    rec = RunRecorder(store, part)
    real = rec.progress

    def stop_at_3(step: int) -> None:
        real(step)
        flag.requested = step == 2

    rec.progress = stop_at_3
    ending = train(cfg, single(), rec, workdir / "b", preemption=flag)
    rec.finish(ending)
    store.move(part, states.QUEUED, states.LAUNCHER)
    second = RunRecorder(store, part)
    second.finish(train(cfg, single(), second, workdir / "b", preemption=Preemption()))
    for key in ("train_loss", "eval_loss"):
        a, b = (store.metrics_frame([key], [r]).set_index("step")["value"].to_dict() for r in (whole, part))
        assert a == b
