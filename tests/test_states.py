"""The run state machine: every allowed and refused transition, on a real SQLite file, and races."""

from __future__ import annotations

import threading

import pytest

from attnres.tracking import run_rows, states
from attnres.tracking.db import get_engine
from attnres.variants.registry import resolve_run

ACTORS = [states.LAUNCHER, states.TRAINER, states.SUPERVISOR, states.MONITOR, states.USER, states.IMPORTER,
          states.RESTORER]

#: the rules written out by hand: (actor, from, to) that are allowed; everything else is refused
ALLOWED = (
    {(states.LAUNCHER, s, states.QUEUED) for s in (states.FAILED, states.KILLED, states.PREEMPTED, states.INCOMPLETE)}
    | {(states.TRAINER, s, to) for s in (states.QUEUED, states.RUNNING, states.PREEMPTED)
       for to in (states.RUNNING, states.FINISHED, states.DIVERGED, states.STOPPED, states.PREEMPTED, states.FAILED)}
    | {(a, s, states.FAILED) for a in (states.SUPERVISOR, states.MONITOR) for s in (states.QUEUED, states.RUNNING)}
    | {(a, states.QUEUED, states.PREEMPTED) for a in (states.SUPERVISOR, states.MONITOR)}  # (monitor: queue gone)
    | {(states.USER, s, states.KILLED) for s in (states.QUEUED, states.RUNNING, states.PREEMPTED)}
    | {(a, states.FINISHED, states.INCOMPLETE) for a in (states.SUPERVISOR, states.MONITOR)}  # (holes)
    | {(a, states.INCOMPLETE, states.FINISHED) for a in (states.SUPERVISOR, states.MONITOR)}  # (filled)
)


@pytest.fixture
def engine(tmp_path):
    return get_engine(str(tmp_path / "runs.db"))


SEEDS = iter(range(10**6))


def new_run(engine, status: str) -> int:
    """A run in ``status``, of a config of its own (one config may have one active run only)."""
    return run_rows.create_run(engine, resolve_run("standard", "tiny", next(SEEDS)), actor=states.IMPORTER,
                            status=status)


def test_every_transition_is_allowed_or_refused_as_the_rules_say(engine):
    seen = 0
    for actor in ACTORS:
        for current in states.STATES:
            for to in states.STATES:
                run = new_run(engine, current)
                expected = (actor, current, to) in ALLOWED
                assert states.allowed(actor, current, to) == expected, (actor, current, to)
                if not any((actor, s, to) in ALLOWED for s in states.STATES):
                    with pytest.raises(states.TransitionError):
                        states.transition(engine, run, to, actor)
                    assert run_rows.status_of(engine, run) == current
                    continue
                outcome = states.transition(engine, run, to, actor, message=f"{actor} says {to}")
                assert outcome.applied == expected, (actor, current, to)
                assert outcome.status == run_rows.status_of(engine, run) == (to if expected else current)
                message = run_rows.get_run(engine, run).message
                assert message == (f"{actor} says {to}" if expected else None)  # fields go with the change only
                seen += 1
    assert seen > len(ALLOWED)


def test_ended_runs_are_never_reopened_but_by_the_launcher():
    ended = set(states.ENDED)
    judged = {states.FINISHED, states.INCOMPLETE}  # a finished run found to lack rows, or given them back
    for actor, current, to in ALLOWED:
        if current in ended and {current, to} != judged:
            assert actor == states.LAUNCHER and to == states.QUEUED
    assert not any(states.allowed(a, states.KILLED, to) for a in ACTORS if a != states.LAUNCHER
                   for to in states.STATES)


def test_a_new_row_starts_in_a_state_its_creator_may_create(engine):
    with pytest.raises(states.TransitionError):
        run_rows.create_run(engine, resolve_run("standard", "tiny", 1), status=states.FINISHED)  # the launcher's
    assert run_rows.status_of(engine, run_rows.create_run(engine, resolve_run("standard", "tiny", 1))) == states.QUEUED
    with pytest.raises(states.TransitionError):
        states.transition(engine, 1, states.RUNNING, states.TRAINER, status=states.FINISHED)


def test_a_missing_run_is_an_outcome_not_an_error(engine):
    outcome = states.transition(engine, 999, states.KILLED, states.USER)
    assert (outcome.applied, outcome.status, bool(outcome)) == (False, None, False)


def test_a_kill_and_a_late_end_race_and_exactly_one_wins(engine):
    """Twenty races of `attnres kill` against the trainer's last word, on separate connections."""
    for _ in range(20):
        run = new_run(engine, states.RUNNING)
        barrier = threading.Barrier(2)
        results = {}

        def move(name: str, to: str, actor: str, run: int = run, barrier=barrier, results=results) -> None:
            barrier.wait()
            results[name] = states.transition(engine, run, to, actor).applied

        threads = [threading.Thread(target=move, args=("kill", states.KILLED, states.USER)),
                   threading.Thread(target=move, args=("end", states.FINISHED, states.TRAINER))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results.values()) == [False, True]
        winner = states.KILLED if results["kill"] else states.FINISHED
        assert run_rows.status_of(engine, run) == winner
        # and whoever comes later cannot undo it
        assert not states.transition(engine, run, states.FAILED, states.MONITOR)
        assert not states.transition(engine, run, states.RUNNING, states.TRAINER)
        assert run_rows.status_of(engine, run) == winner


def test_update_run_cannot_write_a_status(engine):
    run = new_run(engine, states.RUNNING)
    with pytest.raises(states.TransitionError):
        run_rows.update_run(engine, run, status=states.FINISHED)
    run_rows.update_run(engine, run, step=5)
    assert run_rows.get_run(engine, run).step == 5 and run_rows.status_of(engine, run) == states.RUNNING


def test_the_database_index_and_the_machine_agree_on_what_is_active():
    from attnres.tracking.schema import ACTIVE_SQL

    assert ACTIVE_SQL == "status IN ({})".format(", ".join(f"'{s}'" for s in states.ACTIVE))


def test_a_second_active_run_of_a_config_is_refused_by_the_database(engine):
    cfg = resolve_run("standard", "tiny", 1)
    first = run_rows.create_run(engine, cfg)
    with pytest.raises(states.ActiveTwin):
        run_rows.create_run(engine, cfg)
    states.transition(engine, first, states.FAILED, states.SUPERVISOR)
    second = run_rows.create_run(engine, cfg)  # the first is no longer active
    with pytest.raises(states.ActiveTwin):
        states.transition(engine, first, states.QUEUED, states.LAUNCHER)  # reopening it would make twins
    assert run_rows.status_of(engine, first) == states.FAILED and run_rows.status_of(engine, second) == states.QUEUED


def test_who_may_create_a_run_in_which_state(engine):
    cfg = resolve_run("standard", "tiny", 424242)
    for actor in ACTORS:
        for status in states.STATES:
            may = status in {states.LAUNCHER: {states.QUEUED}, states.IMPORTER: set(states.STATES),
                             states.RESTORER: set(states.STATES)}.get(actor, set())
            if may:
                continue  # (creating every combination would make active twins; one row each is enough below)
            with pytest.raises(states.TransitionError):
                run_rows.create_run(engine, cfg, actor=actor, status=status)
    assert run_rows.status_of(engine, run_rows.create_run(engine, cfg, actor=states.RESTORER, status=states.KILLED)) \
        == states.KILLED
