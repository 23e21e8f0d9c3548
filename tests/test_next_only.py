"""`attnres next --only PART` prints that part alone (issue 47, item 10): every launch command it prints is one
that `attnres next --only PART --launch` starts, and the count it announces is the runs that launch records.

It once printed every section under any filter: `--only retry` showed "Variants never run here" with a launch
command that `--launch` then did not run, and announced the retry's runs without its swept values.
"""

from __future__ import annotations

import shlex

import pytest
from helpers import BYTES, FAST_GPT2, cli_here, queue_pid, runs, wait_for

from attnres import run_settings
from attnres.runs.backends.local import process_alive
from attnres.tracking import records, states
from attnres.tracking.run_store import RunStore
from attnres.variants.registry import VARIANTS, resolve_run

STEADY = [*FAST_GPT2, *BYTES[2:], "--set", "steps=20"]
SETTINGS = [STEADY[i + 1] for i in range(0, len(STEADY), 2) if STEADY[i] == "--set"]
TITLES = ("Resolve the open comparisons", "Runs in progress", "Variants never run here", "Failed or diverged runs")


@pytest.fixture
def scope(workdir):
    """standard finished at seeds 1 and 2; control_block failed at seed 1 (no run of it finished): a retry to
    plan; full_attnres running at seed 1; every other variant never run."""
    store = RunStore(str(workdir / "runs.db"))
    first = store.new_launch(records.LAUNCH)
    for variant, seed, status in (("standard", 1, states.FINISHED), ("standard", 2, states.FINISHED),
                                  ("control_block", 1, states.FAILED)):
        rid = store.create_run(resolve_run(variant, "tiny", seed, SETTINGS, "builtin-bytes"), status=status,
                               actor=states.IMPORTER, launch_id=first)
        if variant == "standard" and seed == 2:
            going = store.create_run(resolve_run("full_attnres", "tiny", 1, SETTINGS, "builtin-bytes"),
                                     launch_id=first)
            store.move(going, states.RUNNING, states.TRAINER, step=5)
        if status == states.FINISHED:
            store.update_run(rid, step=20)
            store.log_metrics(rid, [(s, "eval_loss", 3 + seed / 100 + (20 - s) / 100) for s in (0, 10, 20)])
        else:
            store.update_run(rid, step=5, message="loss went to nan")
    RunStore.forget_all()
    return workdir


def sections(out: str) -> list[str]:
    return [t for t in TITLES if any(line.split(". ", 1)[-1] == t for line in out.splitlines())]


def launch_commands(out: str) -> list[list[str]]:
    return [shlex.split(line) for line in out.splitlines() if line.strip().startswith("attnres launch ")]


def cells(command: list[str]) -> set[tuple[str, int, str]]:
    """The runs one printed `attnres launch` command starts: (variant, seed, lr) each (lr: its value, swept or not)."""
    at = command.index("--seeds")
    variants, seeds = command[2:at], []
    for arg in command[at + 1:]:
        if arg.startswith("-"):
            break
        seeds.append(int(arg))
    sets = [command[i + 1] for i, a in enumerate(command) if a == "--set"]
    lrs = next((s.split("=", 1)[1].split(",") for s in sets if s.startswith("lr=")), [""])
    return {(v, s, run_settings.normal(lr) if lr else "") for v in variants for s in seeds for lr in lrs}


def test_each_part_prints_alone_and_announces_the_runs_it_starts(scope):
    never = [v for v in VARIANTS if v not in ("standard", "control_block", "full_attnres")]
    whole = cli_here("next", check=True).stdout
    assert sections(whole) == ["Runs in progress", "Variants never run here", "Failed or diverged runs"]
    assert "full_attnres s1: step 5 of 20" in whole
    total = sum(len(cells(c)) for c in launch_commands(whole))
    assert total == 2 * len(never) + 4  # the never-run variants at standard's 2 seeds; the retry's 2 x 2 lr values
    assert f"\n`attnres next --launch` starts these {total} run(s)." in whole

    retry = cli_here("next", "--only", "retry", check=True).stdout
    assert sections(retry) == ["Failed or diverged runs"] and "Never run in this scope" not in retry
    assert "full_attnres s1" not in retry  # (in progress: a part of the whole plan, not of --only retry)
    [command] = launch_commands(retry)
    assert cells(command) == {(v, 1, lr) for v in ("control_block", "standard") for lr in ("0.0015", "0.00075")}
    assert "With --only retry, `attnres next --launch` starts these 4 run(s)." in retry

    new = cli_here("next", "--only", "new", check=True).stdout
    assert sections(new) == ["Variants never run here"] and "control_block s1 failed" not in new
    [command] = launch_commands(new)
    assert command[2:2 + len(never)] == never and cells(command) == {(v, s, "") for v in never for s in (1, 2)}
    assert f"With --only new, `attnres next --launch` starts these {2 * len(never)} run(s)." in new

    resolve = cli_here("next", "--only", "resolve", check=True).stdout
    assert sections(resolve) == [] and launch_commands(resolve) == []
    assert "nothing to do for --only resolve" in resolve and "--launch` starts" not in resolve


@pytest.mark.integration
def test_launch_under_a_filter_starts_exactly_what_that_filter_printed(scope):
    printed = cli_here("next", "--only", "retry", check=True).stdout
    want = set().union(*(cells(c) for c in launch_commands(printed)))
    done = cli_here("next", "--only", "retry", "--launch", "--detach", check=True)
    try:
        new = [r for r in runs(scope) if r["id"] > 4]
        got = {(r["variant"], r["seed"], run_settings.settings(r["config_json"])["lr"]) for r in new}
        assert got == want and len(new) == 4  # the retry's runs, and no never-run variant
    finally:
        cli_here("kill", "--all", check=True)
        wait_for(lambda: not process_alive(queue_pid(done.stdout)))
    assert {r["status"] for r in runs(scope) if r["id"] > 4} <= {states.KILLED, states.FINISHED}
