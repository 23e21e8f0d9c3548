"""A cut file is not imported (issue 34, item 4): an export killed midway, or a file still being written, ends in a
cut line, and its runs would be recorded as they say they ended (``finished``) with only some of their rows.
`attnres import` refuses it in one line, exit 2, the database byte-identical; the whole file imports."""

from __future__ import annotations

import json

import pytest
from helpers import in_process, metric_rows, sha

HEADER = "variant,seed,step,key,value,status,message"
WHY = "boom, at step 3\nTraceback (most recent call last)"  # a comma and a newline: a quoted field of two lines


@pytest.fixture
def exported(tmp_path, monkeypatch, capsys):
    """A database of three runs (one failed, with a two-line message), exported to ``out/metrics.csv``; and a
    second database, ``target.db``, holding one run already."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNRES_DB", str(tmp_path / "source.db"))
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    rows = [f"standard,{seed},{step},{key},{seed + step / 1000},finished," for seed in (1, 2)
            for step in range(1, 401) for key in ("train_loss", "lr")]
    rows += [f'standard,3,{step},train_loss,{step},failed,"{WHY}"' for step in range(1, 4)]
    (tmp_path / "source.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    assert in_process(["import", "source.csv"], capsys, monkeypatch)[0] == 0
    assert in_process(["export", "--out", "out"], capsys, monkeypatch)[0] == 0
    (tmp_path / "one.csv").write_text("variant,seed,step,key,value\nstandard,9,1,eval_loss,3.0\n")
    assert in_process(["import", "one.csv", "--db", "target.db"], capsys, monkeypatch)[0] == 0
    return tmp_path


def refused(here, name: str, data: bytes, why: str, capsys, monkeypatch) -> None:
    (here / name).write_bytes(data)
    before = sha(here / "target.db")
    code, _, err = in_process(["import", name, "--db", "target.db"], capsys, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].endswith(f"{name}: its last line is cut ({why}): a file still being written, or cut short; "
                             "nothing imported"), lines[0]
    assert sha(here / "target.db") == before


def test_an_export_cut_mid_row_is_refused_and_the_whole_one_imports(exported, capsys, monkeypatch):
    whole = (exported / "out" / "metrics.csv").read_bytes()
    middle = whole.index(b"\n", len(whole) // 2) + 9  # a few bytes into a row
    refused(exported, "cut.csv", whole[:middle], "no newline at the end", capsys, monkeypatch)
    first = whole[:whole.index(b"\n", whole.index(b"\n") + 1) + 1]  # the header and the first row
    short = first + b"run-1,standard,1,500\n"  # a row of 4 of the header's 14 fields
    refused(exported, "short.csv", short, "4 of the header's 14 fields", capsys, monkeypatch)
    quoted = whole[:whole.index(b"boom, at step 3\n") + len(b"boom, at step 3\n")]  # ends with a newline, in quotes
    refused(exported, "quoted.csv", quoted, "a quoted field not closed", capsys, monkeypatch)
    rows = 2 * 400 * 2 + 3
    code, out, _ = in_process(["import", "out/metrics.csv", "--db", "target.db"], capsys, monkeypatch)
    assert code == 0 and f"imported {rows:,} metric rows; 3 new run(s)" in out, out
    assert metric_rows(exported / "target.db", None) == rows + 1


def test_a_cut_jsonl_file_is_refused(exported, capsys, monkeypatch):
    objects = [json.dumps({"variant": "standard", "seed": 5, "step": s, "key": "train_loss", "value": 1 / s})
               for s in range(1, 51)]
    whole = ("\n".join(objects) + "\n").encode()
    refused(exported, "cut.jsonl", whole[:-20], "no newline at the end", capsys, monkeypatch)
    refused(exported, "open.jsonl", whole[:-20] + b"\n", "not a whole JSON object", capsys, monkeypatch)
    refused(exported, "last.jsonl", whole[:-1], "no newline at the end", capsys, monkeypatch)
    (exported / "whole.jsonl").write_bytes(whole + b"\n")  # a blank line at the end changes nothing
    code, out, _ = in_process(["import", "whole.jsonl", "--db", "target.db"], capsys, monkeypatch)
    assert code == 0 and "imported 50 metric rows; 1 new run(s)" in out, out


def test_blank_lines_after_the_last_row_are_not_a_cut(exported, capsys, monkeypatch):
    whole = (exported / "out" / "metrics.csv").read_bytes()
    (exported / "blank.csv").write_bytes(whole + b"\n\n")
    code, out, err = in_process(["import", "blank.csv", "--db", "target.db"], capsys, monkeypatch)
    assert code == 0 and "3 new run(s)" in out, err
