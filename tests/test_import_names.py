"""Imported names and free text: checked names, escaped text, runs never merged, every row accounted for.

An import takes what other machines recorded: an experiment named like rich markup, a device with a
`|` and a `<script>`, a message with an `<img onerror>`, two experiments with the same variant and
seed. None of it may break `attnres status` or the report, and an import either records the whole
file, saying how many rows the database gained, or nothing (one line, exit 2).
"""

from __future__ import annotations

import hashlib
import re
import sqlite3

import pandas as pd
import pytest
from helpers import in_process, sha

from attnres.reports.escape import cell_text
from attnres.tracking import import_record, run_rows, states
from attnres.tracking.db import get_engine
from attnres.tracking.transfer import import_file

HEADER = "variant,seed,step,key,value,experiment"
TWO_EXPERIMENTS = f"""{HEADER}
standard,42,0,eval_loss,4.0,expA
standard,42,10,eval_loss,3.0,expA
standard,42,0,eval_loss,4.5,expB
standard,42,10,eval_loss,3.5,expB
"""
DEVICE = "a|b <script>alert(1)</script>"
MESSAGE = "<img src=x onerror=alert(1)>"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A folder with its own database (no corpus: nothing here trains)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNRES_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    return tmp_path


def stored(db) -> int:
    """Every point the database holds: metric rows and depth-map weights."""
    with sqlite3.connect(db) as conn:
        return sum(conn.execute(f"select count(*) from {t}").fetchone()[0] for t in ("metrics", "depth_weights"))


def refused(args, db, capsys, monkeypatch, *words) -> str:
    """Run a command that must be refused: one line naming ``words``, exit 2, the database byte-identical."""
    before = sha(db)
    code, _, err = in_process(args, capsys, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert all(w in lines[0] for w in words), lines[0]
    assert sha(db) == before
    return lines[0]


@pytest.fixture
def recorded(here, capsys, monkeypatch):
    """A database already holding the two experiments' runs."""
    (here / "two.csv").write_text(TWO_EXPERIMENTS)
    assert in_process(["import", "two.csv"], capsys, monkeypatch)[0] == 0
    get_engine(str(here / "runs.db")).dispose()
    return here / "runs.db"


def test_a_markup_experiment_name_is_refused_and_changes_nothing(recorded, capsys, monkeypatch):
    (recorded.parent / "bad.csv").write_text(f"{HEADER}\nstandard,1,0,eval_loss,4.0,x[/bold]y\n")
    refused(["import", "bad.csv"], recorded, capsys, monkeypatch, "row 1", "experiment", "x[/bold]y")
    (recorded.parent / "bad-preset.csv").write_text("variant,seed,step,key,value,preset\nstandard,1,0,a,1,a b\n")
    refused(["import", "bad-preset.csv"], recorded, capsys, monkeypatch, "row 1", "preset")


def test_status_shows_a_markup_name_already_stored_as_it_is(here, capsys, monkeypatch):
    """A database written before names were checked: status prints the name literally, never as markup."""
    old_run(get_engine(str(here / "runs.db")), experiment="x[/bold]y", config_hash="h")
    code, out, err = in_process(["status"], capsys, monkeypatch)
    assert code == 0 and "x[/bold]y" in out, err


def old_run(engine, **columns) -> int:
    """A finished run as an earlier attnres recorded it (no checks of its names)."""
    return states.create(engine, states.IMPORTER, states.FINISHED, **{
        "variant": "standard", "seed": 42, "preset": "imported", "data": "imported:old.csv", "config_json": "{}",
        "total_steps": 10, "step": 10, "created_at": run_rows.now(), **columns})


def table_widths(text: str) -> list[set[int]]:
    """Per markdown table of the text, the numbers of cells its rows have (an escaped `\\|` is no border)."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append(len(re.split(r"(?<!\\)\|", line)))
        elif rows:
            tables.append(set(rows))
            rows = []
    return tables


def test_free_text_is_stored_as_given_and_escaped_where_shown(here, capsys, monkeypatch):
    rows = [("standard", 42, s, 5.0 - s / 10, "finished", "") for s in (0, 10)]
    rows += [("control_block", 42, s, 5.1 - s / 10, "failed", MESSAGE) for s in (0, 5)]
    frame = pd.DataFrame(rows, columns=["variant", "seed", "step", "value", "status", "message"])
    frame.assign(key="eval_loss", experiment="expA", device=DEVICE).to_csv(here / "text.csv", index=False)
    assert in_process(["import", "text.csv"], capsys, monkeypatch)[0] == 0
    with sqlite3.connect(here / "runs.db") as conn:
        assert set(conn.execute("select device, message from runs")) == {(DEVICE, None), (DEVICE, MESSAGE)}
    code, _, err = in_process(["status"], capsys, monkeypatch)
    assert code == 0, err
    assert in_process(["report", "--experiment", "expA", "--no-plots", "--out", "r.md"], capsys, monkeypatch)[0] == 0
    text = (here / "r.md").read_text()
    devices = next(line for line in text.splitlines() if line.startswith("- Devices:"))
    assert cell_text(DEVICE) in devices and "<script>" not in text
    ended = text.split("## Runs That Ended Early")[1].split("\n## ")[0]
    assert cell_text(MESSAGE) in ended and "<img" not in ended
    widths = table_widths(text)
    assert widths and all(len(w) == 1 for w in widths), widths


def test_no_raw_html_anywhere_in_the_report(here, capsys, monkeypatch):
    pd.DataFrame({"variant": ["standard", "standard", "control_block", "control_block"], "seed": 42,
                  "step": [0, 10, 0, 5], "key": "eval_loss", "value": [5.0, 4.0, 5.1, 4.6],
                  "status": ["finished", "finished", "failed", "failed"], "message": ["", "", MESSAGE, MESSAGE],
                  }).to_csv(here / "m.csv", index=False)
    assert in_process(["import", "m.csv"], capsys, monkeypatch)[0] == 0
    assert in_process(["report", "--no-plots", "--out", "r.md"], capsys, monkeypatch)[0] == 0
    assert "<img" not in (here / "r.md").read_text()


def test_two_experiments_stay_two_runs_and_export_round_trips(recorded, capsys, monkeypatch):
    with sqlite3.connect(recorded) as conn:
        assert sorted(conn.execute("select experiment, variant, seed from runs")) == [
            ("expA", "standard", 42), ("expB", "standard", 42)]
    assert in_process(["export", "--out", "out"], capsys, monkeypatch)[0] == 0
    cols = ["experiment", "variant", "seed", "step", "key", "value"]
    given = pd.read_csv(recorded.parent / "two.csv")[cols].sort_values(cols, ignore_index=True)
    exported = pd.read_csv(recorded.parent / "out" / "metrics.csv")[cols].sort_values(cols, ignore_index=True)
    pd.testing.assert_frame_equal(given, exported)


def test_the_count_printed_is_what_the_database_gained(here, capsys, monkeypatch):
    (here / "n.csv").write_text(f"{HEADER}\nstandard,1,0,eval_loss,4.0,e\nstandard,1,0,eval_loss,4.0,e\n"
                                f"control_block,1,10,depth:01:embedding,0.5,e\nstandard,1,10,eval_loss,3.0,e\n")
    for expected in (3, 0):  # (a point given twice is one point; a second import adds nothing)
        before = stored(here / "runs.db") if (here / "runs.db").exists() else 0
        code, out, err = in_process(["import", "n.csv"], capsys, monkeypatch)
        assert code == 0, err
        printed = int(re.search(r"imported ([\d,]+) metric rows", out).group(1).replace(",", ""))
        assert printed == expected == stored(here / "runs.db") - before, out
    assert "3 already recorded" in out and "1 repeated in the file" in out


def test_a_point_with_two_values_refuses_the_file(recorded, capsys, monkeypatch):
    here = recorded.parent
    (here / "twice.csv").write_text(f"{HEADER}\nstandard,7,0,eval_loss,4.0,e\nstandard,7,0,eval_loss,4.2,e\n")
    refused(["import", "twice.csv"], recorded, capsys, monkeypatch, "row 2", "row 1", "eval_loss")
    (here / "changed.csv").write_text(f"{HEADER}\nstandard,42,5,eval_loss,3.3,expB\n"
                                      "standard,42,10,eval_loss,3.4,expB\n")
    refused(["import", "changed.csv"], recorded, capsys, monkeypatch, "row 2", "eval_loss", "3.5", "nothing")


def test_a_column_named_twice_is_refused(recorded, capsys, monkeypatch):
    (recorded.parent / "dup.csv").write_text("variant,seed,step,key,value,value\nstandard,1,0,eval_loss,4.0,9.0\n")
    refused(["import", "dup.csv"], recorded, capsys, monkeypatch, "'value'", "twice")
    (recorded.parent / "dup.jsonl").write_text('{"variant": "standard", "seed": 1, "step": 0, "key": "a", '
                                               '"value": 1, "value": 2}\n')
    refused(["import", "dup.jsonl"], recorded, capsys, monkeypatch, "'value'", "twice")


def test_an_import_that_fails_halfway_leaves_nothing(recorded, monkeypatch):
    """One transaction: a run is never left finished without its rows (nor its stage without its runs)."""
    (recorded.parent / "more.csv").write_text(f"{HEADER}\nstandard,1,0,eval_loss,4.0,e\nstandard,2,0,eval_loss,4.0,e\n")
    written = import_record._write
    calls = []

    def fail_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return written(*args)

    monkeypatch.setattr(import_record, "_write", fail_second)
    before = sha(recorded)
    with pytest.raises(RuntimeError):
        import_file(get_engine(str(recorded)), recorded.parent / "more.csv")
    get_engine(str(recorded)).dispose()
    assert sha(recorded) == before and len(calls) == 2


def test_a_run_of_an_earlier_import_is_found_again(here):
    """Runs imported before the scope was part of a run's identity keep their rows: a re-import adds none."""
    engine = get_engine(str(here / "runs.db"))
    legacy = hashlib.sha256(b"import:standard-s42:standard:42").hexdigest()[:12]
    run = old_run(engine, experiment="expA", config_hash=legacy)
    (here / "two.csv").write_text(TWO_EXPERIMENTS)
    got = import_file(engine, here / "two.csv")
    assert got["runs_created"] == 1 and got["rows"] == 4  # expB is a run of its own; expA's rows join run 1
    with sqlite3.connect(here / "runs.db") as conn:
        assert conn.execute("select count(*) from metrics where run_id = ?", (run,)).fetchone()[0] == 2
