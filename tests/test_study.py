"""`attnres study` (issue 46, part 4): stages of What's Next, each launched as `attnres next --launch` launches it
(pre-registered), until the comparisons are resolved, a limit is reached or more seeds would not help. Stopped
(SIGTERM, Ctrl-C) it is recorded interrupted, and the same command goes on where it stopped, launching no run twice.
Bad limits and names are one line, exit 2, and leave the database as it was."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from helpers import cli_here, database_at, runs, wait_for

from attnres.errors import AttnresError
from attnres.runs import study
from attnres.runs.backends.local import process_alive
from attnres.runs.study import Outlook
from attnres.runs.study_limits import Limits, deadline, hours
from attnres.tracking import records, states
from attnres.tracking.run_store import RunStore
from attnres.variants.registry import VARIANTS, resolve_run

# the runs' settings: a tiny model on bytes, 40 steps, an eval (and a checkpoint) every 20
SETTINGS = ["batch_size=4", "eval_batches=2", "eval_every=20", "log_every=2", "warmup=2", "n_layer=2", "d_model=32",
            "n_head=2", "seq_len=32", "vocab_size=320", "steps=40"]
SEEDS = {1: 8.00, 2: 8.02, 3: 7.99}  # the baseline's final eval losses (a real run of 40 steps ends near 3.4)


def seeded(workdir: Path, leave: tuple[str, ...] = (), steps: int = 40) -> RunStore:
    """Every registry variant but ``leave`` finished at seeds 1-3 (recorded here, with their configs, without
    training): each variant 0.5 worse than the one before it, by the same amount at every seed, so every comparison
    is resolved. A variant left out is the plan's never-run part: one stage of 3 runs, at the baseline's seeds."""
    store = RunStore(str(workdir / "runs.db"))
    first = store.new_launch(records.LAUNCH)
    for i, variant in enumerate(v for v in VARIANTS if v not in leave):
        for seed, base in SEEDS.items():
            final = base + 0.5 * i + 0.0001 * seed * i
            settings = [*SETTINGS[:-1], f"steps={steps}"]
            rid = store.create_run(resolve_run(variant, "tiny", seed, settings, "builtin-bytes"),
                                   status=states.FINISHED, actor=states.IMPORTER, launch_id=first)
            store.update_run(rid, step=steps)
            store.log_metrics(rid, [(s, "eval_loss", final + (steps - s) / 20) for s in (0, steps // 2, steps)])
    RunStore.forget_all()
    return store


def content(db: Path) -> list[str]:
    """The database's content, statement by statement (what a command must leave as it was)."""
    with sqlite3.connect(db) as conn:
        return list(conn.iterdump())


def studies(workdir: Path) -> list[dict]:
    with sqlite3.connect(workdir / "runs.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("select * from studies order by id")]


def stages(workdir: Path) -> list[dict]:
    with sqlite3.connect(workdir / "runs.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("select * from launches where study_id is not null order by id")]


BAD = [
    (["--max-runs", "0"], "--max-runs"),
    (["--max-runs", "-2"], "--max-runs"),
    (["--max-stages", "0"], "--max-stages"),
    (["--max-hours", "-1"], "bad --max-hours '-1.0'"),
    (["--max-hours", "0"], "bad --max-hours '0.0'"),
    (["--max-hours", "nan"], "bad --max-hours 'nan'"),
    (["--deadline", "2020-01-01T00:00"], "--deadline '2020-01-01T00:00' is not in the future"),
    (["--deadline", "0s"], "--deadline '0s' is not in the future"),
    (["--deadline", "next tuesday"], "bad --deadline 'next tuesday'"),
    (["--baseline", "standrd"], "unknown variant 'standrd'; did you mean 'standard'?"),
    (["--only", "retry"], "a study launches the resolve and new parts"),
    (["--only", "everything"], "--only everything"),
    (["--experiment", "nope"], "no runs match --experiment nope"),
    (["--resume", "7"], "no study 7"),
    (["--resume", "1", "--experiment", "tiny"], "--resume continues study 1 in the scope it recorded"),
]


@pytest.mark.parametrize(("args", "said"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_limits_and_names_are_one_line_exit_2_and_record_nothing(workdir, args, said):
    seeded(workdir, leave=("control_block",))
    before = content(workdir / "runs.db")
    done = cli_here("study", *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], \
        done.stderr
    assert content(workdir / "runs.db") == before
    assert not (workdir / "logs").exists()


def test_without_a_database_it_is_one_line_and_makes_none(workdir):
    done = cli_here("study", "--max-runs", "3")
    assert done.returncode == 2 and "no database at" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (workdir / "runs.db").exists()


def test_limits_parse_to_what_a_study_records():
    now = datetime(2026, 12, 6, 12, 0)
    assert deadline("90m", now) == now + timedelta(minutes=90)
    assert deadline("1h30m", now) == deadline("1.5h", now) == now + timedelta(hours=1.5)
    assert deadline("2026-12-06T15:00+02:00", now) == datetime(2026, 12, 6, 13, 0)
    assert deadline("2026-12-07T00:00Z", now) == datetime(2026, 12, 7)
    with pytest.raises(AttnresError, match="not in the future"):
        deadline("2026-12-06T11:59Z", now)
    with pytest.raises(AttnresError, match="bad --max-hours"):
        hours(float("inf"))
    limits = Limits(5, 2.5, datetime(2026, 12, 7), 3)
    assert Limits.from_dict(json.loads(json.dumps(limits.to_dict()))) == limits
    assert limits.replaced(Limits(max_runs=9)) == Limits(9, 2.5, datetime(2026, 12, 7), 3)
    assert Limits().text() == "no limit" and "at most 5 run(s)" in limits.text()


def outlook(requests: int = 1, compared: int = 3, resolved: int = 1, waiting: int = 0, beyond: int = 0) -> Outlook:
    from attnres.runs.planning import request

    return Outlook("a scope", {}, [request(["standard"], [1])] * requests, {}, compared, resolved, waiting, beyond)


ENDS = [  # (what the plan says, the limits, stages, runs, hours) -> the end, and a word of its message
    (outlook(requests=0, resolved=3), Limits(max_runs=1), 0, 5, 0.0, study.RESOLVED, "resolved: 3 of 3"),
    (outlook(requests=0, beyond=2), Limits(), 1, 4, 0.1, study.BEYOND, "stopped: beyond --max-seeds: 2 of the 2"),
    (outlook(requests=0, waiting=2), Limits(), 1, 4, 0.1, study.NOTHING, "2 of them wait for runs not going"),
    (outlook(), Limits(max_stages=2), 2, 4, 0.1, study.MAX_STAGES, "--max-stages 2 reached"),
    (outlook(), Limits(deadline=datetime(2026, 1, 1)), 1, 4, 0.1, study.DEADLINE, "2026-01-01 00:00:00 UTC"),
    (outlook(), Limits(max_hours=0.1), 1, 4, 0.1, study.MAX_HOURS, "--max-hours 0.1 spent"),
    (outlook(), Limits(max_runs=4), 1, 4, 0.1, study.MAX_RUNS, "--max-runs 4 spent"),
    (outlook(), Limits(5, 1.0, datetime(2027, 1, 1), 3), 2, 4, 0.9, None, None),
]


@pytest.mark.parametrize(("out", "limits", "stages", "spent", "hours", "reason", "said"), ENDS,
                         ids=[str(e[5]) for e in ENDS])
def test_a_study_ends_before_a_stage_when_the_plan_or_a_limit_says_so(out, limits, stages, spent, hours, reason, said):
    """Nothing to launch ends a study for the plan's reason, whatever its limits; otherwise each limit stops it
    before the next stage (reached, not passed: a stage under way is never cut)."""
    end = study.verdict(out, {"parts": ["resolve"], "max_seeds": 10}, limits, stages, spent, hours,
                        datetime(2026, 6, 1))
    assert (end is None and reason is None) or (end[0] == reason and said in end[1]), end


def test_a_database_of_the_revision_before_gains_the_studies_table(workdir):
    """Migration 0011 (`attnres db upgrade`): the studies table and the launches' study_id, the runs kept."""
    database_at(workdir / "runs.db", "0010")
    assert cli_here("study").returncode == 2  # (an older schema: one line asking for the upgrade)
    cli_here("db", "upgrade", check=True)
    with sqlite3.connect(workdir / "runs.db") as conn:
        assert "study_id" in {r[1] for r in conn.execute("pragma table_info(launches)")}
        assert {"command_key", "hours_carried", "driver_pid"} <= {r[1] for r in conn.execute(
            "pragma table_info(studies)")}
    assert len(runs(workdir)) == 1


def test_a_resolved_scope_ends_at_once_recorded_and_reported(workdir):
    """Every comparison resolved and no variant left to run: the study ends resolved before any stage, having
    spent nothing; the report says how it ended."""
    seeded(workdir)
    done = cli_here("study", "--max-runs", "4", check=True)
    assert "study 1 ended, resolved: 16 of 16 comparison(s); spent: 0 stage(s), 0 run(s)" in done.stdout
    [study] = studies(workdir)
    assert (study["state"], study["end_reason"], study["runs_spent"], study["hours_spent"]) == ("ended", "resolved",
                                                                                                0, 0)
    assert study["driver_pid"] is None and json.loads(study["limits_json"])["max_runs"] == 4
    assert json.loads(study["scope_json"]) == {"experiment": "tiny", "preset": "tiny", "budget": 40,
                                               "data": "builtin-bytes", "pick": {}, "baseline": "standard",
                                               "parts": ["resolve", "new"], "max_seeds": 10}
    cli_here("report", "--no-plots", "--out", "r.md", check=True)
    text = (workdir / "r.md").read_text()
    assert "## Studies" in text and "**Study 1**" in text and "ended, resolved: 16 of 16 comparison(s)" in text
    assert "limits: max-runs 4" in text and "Spent: 0 stage(s), 0 run(s)" in text


def test_a_stage_larger_than_what_is_left_of_max_runs_is_not_launched(workdir):
    """A stage is launched whole (its seeds are registered together): 3 runs do not fit in --max-runs 2."""
    seeded(workdir, leave=("control_block",))
    done = cli_here("study", "--max-runs", "2", check=True)
    assert "stopped: --max-runs 2: the next stage needs 3 run(s), 2 left" in done.stdout
    assert [s["end_reason"] for s in studies(workdir)] == ["max-runs"] and not stages(workdir)
    assert len(runs(workdir)) == 15 * 3


@pytest.mark.integration
def test_a_study_stopped_by_sigterm_goes_on_where_it_stopped(workdir):
    """Detached, the study's driver is a process of its own; SIGTERM while its stage trains records it interrupted,
    its runs preempted with their checkpoint. The same command then continues those runs (not new ones) and ends
    the study resolved, with what it spent."""
    seeded(workdir, leave=("control_block",), steps=400)  # (40 steps can end before a poll sees them train)
    started = cli_here("study", "--detach", check=True)
    assert "study 1 runs in the background (pid" in started.stdout
    pid = int(started.stdout.split("(pid ")[1].split(";")[0])

    def training() -> bool:
        return any(r["variant"] == "control_block" and r["status"] == states.RUNNING and r["step"] >= 1
                   for r in runs(workdir))

    wait_for(training, timeout=600)  # (a loaded machine: the study, torchrun and a trainer start first)
    [stage] = stages(workdir)  # the stage, recorded with its pre-registration and the study it belongs to
    assert stage["origin"] == records.NEXT and json.loads(stage["plan_json"])["comparisons"] == [
        {"against": "standard", "kind": "new", "n": [3, 3], "variant": "control_block"}]
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not process_alive(pid), timeout=600)
    [study] = studies(workdir)
    assert study["state"] == "interrupted" and "(SIGTERM) at stage 1" in study["message"], study
    assert study["driver_pid"] is None and study["runs_spent"] == 3
    mine = [r for r in runs(workdir) if r["variant"] == "control_block"]
    assert sorted(r["seed"] for r in mine) == [1, 2, 3] and {r["status"] for r in mine} == {states.PREEMPTED}
    log = (workdir / "logs" / "study-1.log").read_text()
    assert "stage 1:" in log and "study 1 interrupted (SIGTERM)" in log

    done = cli_here("study", check=True)  # the same command, in the foreground (here): study 1 goes on
    assert "study 1 (continued)" in done.stdout
    assert "study 1 ended, resolved: 16 of 16 comparison(s); spent: 1 stage(s), 3 run(s)" in done.stdout
    assert "continuing the preempted runs" in done.stderr
    after = [r for r in runs(workdir) if r["variant"] == "control_block"]
    assert [r["id"] for r in after] == [r["id"] for r in mine]  # the same runs, continued: none launched twice
    assert {r["status"] for r in after} == {states.FINISHED} and len(runs(workdir)) == 15 * 3 + 3
    [study] = studies(workdir)
    assert (study["state"], study["end_reason"], study["runs_spent"]) == ("ended", "resolved", 3)
    assert study["hours_spent"] > 0 and len(stages(workdir)) == 1
