"""The state machine only records; the lifecycle layer above it starts `--on-end` and recovers spools.

In process, on a real SQLite file, with a real `--on-end` command.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from attnres import on_end
from attnres.tracking import lifecycle, run_rows, spool, states
from attnres.tracking.db import get_engine
from attnres.tracking.records import RunRecord
from attnres.variants.registry import resolve_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    return get_engine(str(tmp_path / "runs.db"))


def running(engine, tmp_path, seed: int) -> tuple[int, Path]:
    """A running run whose --on-end command appends its state to a file."""
    run = run_rows.create_run(engine, resolve_run("standard", "tiny", seed))
    ends = tmp_path / f"ends-{run}.txt"
    cmd = [sys.executable, "-c", f"import os; open({str(ends)!r}, 'a').write(os.environ['ATTNRES_STATE'] + '\\n')"]
    run_rows.update_run(engine, run, on_end_json=json.dumps(cmd))
    assert states.transition(engine, run, states.RUNNING, states.TRAINER)
    return run, ends


@pytest.mark.integration  # (the --on-end command is a process)
def test_recording_an_end_starts_nothing_and_moving_to_it_starts_the_command_once(engine, tmp_path):
    quiet, quiet_ends = running(engine, tmp_path, 1)
    assert states.transition(engine, quiet, states.FINISHED, states.TRAINER)  # the record alone
    run, ends = running(engine, tmp_path, 2)
    assert lifecycle.move(engine, run, states.FINISHED, states.TRAINER)
    assert not lifecycle.move(engine, run, states.FAILED, states.SUPERVISOR)  # decided already: nothing again
    # found incomplete (holes), then made whole by a sync: still the one end, one command
    assert lifecycle.move(engine, run, states.INCOMPLETE, states.MONITOR, where={"status": states.FINISHED})
    assert lifecycle.move(engine, run, states.FINISHED, states.MONITOR, where={"status": states.INCOMPLETE})
    on_end.wait()
    assert ends.read_text() == "finished\n"
    assert not quiet_ends.exists()
    assert run_rows.status_of(engine, quiet) == states.FINISHED


@pytest.mark.integration  # (the --on-end command is a process)
def test_recover_reads_the_spool_under_its_lock_and_starts_the_end_it_replays(engine, tmp_path):
    run, ends = running(engine, tmp_path, 3)
    path = RunRecord.of(run_rows.get_run(engine, run)).spool
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"r": run, "s": 5, "m": {"train_loss": 1.5}}) + "\n"
                    + spool.fields_line(run, {"status": states.FINISHED}))
    with spool.held(path), lifecycle.recover(engine, path, wait=False) as busy:  # another process holds it
        assert not busy.held and not busy.read
    assert run_rows.status_of(engine, run) == states.RUNNING and path.stat().st_size
    with lifecycle.recover(engine, path, only_if=lambda: False) as asked:  # (a new attempt's spool: not read)
        assert asked.held and not asked.read
    assert run_rows.status_of(engine, run) == states.RUNNING
    with lifecycle.recover(engine, path) as got:
        assert got.read and got.counts["rows"] == 1
        assert run_rows.status_of(engine, run) == states.FINISHED  # judged inside, under the same lock
    on_end.wait()
    assert ends.read_text() == "finished\n" and path.stat().st_size == 0


def _calls(tree: ast.Module, owner: str, attr: str) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == attr and isinstance(n.func.value, ast.Name) and n.func.value.id == owner]


def test_states_change_through_the_lifecycle_and_spools_are_read_through_recover_only():
    """No module records a state change past the lifecycle layer (which would skip --on-end), or reads a spool
    into the database without its lock (recover); the state machine itself starts nothing."""
    offenders = []
    for path in sorted([*(ROOT / "attnres").rglob("*.py"), *(ROOT / "cli").rglob("*.py"),
                        *(ROOT / "reports").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("attnres/tracking/lifecycle.py", "attnres/tracking/states.py", "attnres/tracking/spool.py"):
            continue
        tree = ast.parse(path.read_text())
        offenders += [f"{rel}:{n} states.transition" for n in _calls(tree, "states", "transition")]
        offenders += [f"{rel}:{n} spool.ingest" for n in _calls(tree, "spool", "ingest")]
        offenders += [f"{rel}: imports transition" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                      and n.module == "attnres.tracking.states" and any(a.name == "transition" for a in n.names)]
    assert not offenders, offenders
    source = (ROOT / "attnres/tracking/states.py").read_text()
    assert "on_end" not in source and "lifecycle" not in source.split('"""', 2)[2]


def test_an_end_starts_its_on_end_command_from_one_place():
    """`--on-end` starts in :func:`lifecycle.ended`, called by :func:`lifecycle.move` alone (a spool's replay records
    its changes through move): one rule of what an end is, in one place."""
    calls = []
    for path in sorted([*(ROOT / "attnres").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        rel = path.relative_to(ROOT).as_posix()
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
                name = getattr(call.func, "attr", getattr(call.func, "id", None))
                if name in ("run_ended", "ended"):
                    calls.append((rel, fn.name, name))
    assert sorted(calls) == [("attnres/tracking/lifecycle.py", "ended", "run_ended"),
                             ("attnres/tracking/lifecycle.py", "move", "ended")], calls
    assert "ENDED" not in (ROOT / "attnres/tracking/spool.py").read_text()


def test_read_verbs_call_no_writer():
    """What `status` and the documents show is derived: neither they nor the modules that build them call the
    reconciler, a sync, a completeness write or a state change (test_read_only checks the database itself)."""
    writes = {"reconcile", "sync", "recheck", "check_complete", "move", "transition", "recover", "summarize"}
    read_modules = [ROOT / "attnres/runs/status_view.py", ROOT / "cli/documents.py", ROOT / "cli/files_cmd.py",
                    *(ROOT / "reports").rglob("*.py")]
    found = []
    for path in read_modules:
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(ROOT)}:{n.lineno} {n.func.attr}" for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in writes]
    main = ast.parse((ROOT / "cli/main.py").read_text())
    for fn in [n for n in main.body if isinstance(n, ast.FunctionDef) and n.name in ("status", "logs")]:
        found += [f"cli/main.py:{n.lineno} {getattr(n.func, 'attr', getattr(n.func, 'id', ''))}" for n in ast.walk(fn)
                  if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in writes]
    assert not found, found
