"""Issue 47, files that are not ours: every output a verb writes (``--out``, ``--plot``, ``--figures``, the files an
export or a report writes into its folder) goes only to a regular file, a new one or an existing one; a device, a
named pipe, a socket or a link to one is refused in one line, exit 2, before any work, and left as it is. And an
exported CSV is safe to open in a spreadsheet: no cell runs as a formula, yet it imports back to the same values."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import socket
import stat
from pathlib import Path

import pandas as pd
import pytest
from helpers import arms_csv, in_process, runs, sha

from attnres import outputs
from attnres.errors import AttnresError

DEVICES = ("/dev/full", "/dev/null")


def one_line(err: str) -> bool:
    return err.startswith("error: ") and err.strip().count("\n") == 0 and "Traceback" not in err


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry under ``folder`` as it is on disk, links not followed (kind, link target, content), the database's
    files left out; and the devices' kind and numbers."""
    seen: dict[str, object] = {}
    for p in sorted(folder.rglob("*")):
        if p.name.startswith("runs.db"):
            continue
        mode = os.lstat(p).st_mode
        if stat.S_ISLNK(mode):
            seen[str(p.relative_to(folder))] = ("link", os.readlink(p))
        elif stat.S_ISREG(mode):
            seen[str(p.relative_to(folder))] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            seen[str(p.relative_to(folder))] = ("other", stat.S_IFMT(mode))
    for dev in DEVICES:
        st = os.lstat(dev)
        seen[dev] = (stat.S_ISCHR(st.st_mode), st.st_rdev, st.st_ino)
    return seen


@pytest.fixture
def recorded(workdir, capsys, monkeypatch) -> Path:
    """runs.db holding two variants x two seeds (an import), and each kind of special file in the folder."""
    path = arms_csv(workdir, {"standard": {1: 3.0, 2: 3.1}, "control_block": {1: 2.9, 2: 3.0}})
    code, _, err = in_process(["import", path], capsys, monkeypatch)
    assert code == 0, err
    os.mkfifo(workdir / "fifo.md")
    os.symlink("/dev/null", workdir / "null.md")
    os.symlink(workdir / "fifo.md", workdir / "tofifo.md")
    server = socket.socket(socket.AF_UNIX)
    server.bind("sock.md")  # (relative: a socket's path is short; the test runs in workdir)
    yield workdir / "runs.db"
    server.close()


# what each special file is called in the one line
SPECIAL = {"fifo.md": "a named pipe (FIFO)", "/dev/full": "a character device", "/dev/null": "a character device",
           "null.md": "a link to a character device", "tofifo.md": "a link to a named pipe (FIFO)",
           "sock.md": "a socket"}
FILE_OUTPUTS = [
    (["report", "--no-plots", "--out"], "--out"),
    (["report", "--out"], "--out"),
    (["report", "--scaling", "--out"], "--out"),
    (["compare", "standard", "control_block", "--out"], "--out"),
    (["compare", "standard", "control_block", "--plot"], "--plot"),
    (["inspect", "1", "--out"], "--out"),
]


@pytest.mark.parametrize("target", list(SPECIAL))
@pytest.mark.parametrize(("args", "option"), FILE_OUTPUTS, ids=[" ".join(a) for a, _ in FILE_OUTPUTS])
def test_a_special_file_as_an_output_is_refused_and_left_as_it_is(recorded, workdir, capsys, monkeypatch, args,
                                                                   option, target):
    before, db = snapshot(workdir), sha(recorded)
    code, out, err = in_process([*args, target], capsys, monkeypatch)
    assert code == 2 and one_line(err) and out == "", err
    assert f"cannot write {option} {target}: it is {SPECIAL[target]}, not a regular file" in err, err
    assert snapshot(workdir) == before and sha(recorded) == db  # the device is still a device, the pipe a pipe


FOLDER_OUTPUTS = [["export", "--out"], ["export", "--format", "parquet", "--out"], ["report", "--figures"],
                  ["data", "prepare", "--out"]]


@pytest.mark.parametrize("target", list(SPECIAL))
@pytest.mark.parametrize("args", FOLDER_OUTPUTS, ids=" ".join)
def test_a_special_file_where_a_folder_is_written_is_refused(recorded, workdir, capsys, monkeypatch, args, target):
    before, db = snapshot(workdir), sha(recorded)
    code, out, err = in_process([*args, target], capsys, monkeypatch)
    assert code == 2 and one_line(err) and out == "", err
    assert SPECIAL[target] in err and "folder" in err, err
    assert snapshot(workdir) == before and sha(recorded) == db


@pytest.mark.parametrize(("args", "inside"), [
    (["export", "--out", "exp"], "exp/runs.csv"),
    (["export", "--out", "exp"], "exp/metrics.csv"),
    (["export", "--format", "parquet", "--out", "exp"], "exp/metrics.parquet"),
    (["report", "--out", "r.md"], "r_figures/delta_curves.png"),
    (["report", "--out", "r.md", "--figures", "figs"], "figs/depth_maps.png"),
    (["report", "--scaling", "--out", "s.md"], "s_figures/scaling.png"),
])
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/full"])
def test_a_special_file_among_the_files_a_folder_output_writes_is_refused_before_any_work(
        recorded, workdir, capsys, monkeypatch, args, inside, kind):
    place = workdir / inside
    place.parent.mkdir()
    os.mkfifo(place) if kind == "fifo" else os.symlink("/dev/full", place)
    before, db = snapshot(workdir), sha(recorded)
    code, out, err = in_process(args, capsys, monkeypatch)
    assert code == 2 and one_line(err) and out == "", err
    assert f"cannot write '{inside}': it is" in err and "not a regular file" in err, err
    assert snapshot(workdir) == before and sha(recorded) == db  # nothing written beside it either


def test_a_new_file_an_existing_regular_one_and_a_link_to_one_are_written(recorded, workdir, capsys, monkeypatch):
    (workdir / "old.md").write_text("old\n")
    (workdir / "target.md").write_text("old\n")
    os.symlink(workdir / "target.md", workdir / "link.md")
    for name in ("new.md", "old.md", "link.md"):
        code, out, err = in_process(["report", "--no-plots", "--out", name], capsys, monkeypatch)
        assert code == 0 and f"wrote {name}" in out, err
        assert (workdir / name).read_text().startswith("#"), name
    code, out, err = in_process(["export", "--out", "exp"], capsys, monkeypatch)
    assert code == 0 and (workdir / "exp" / "metrics.csv").is_file(), err


# -- the library's writers: refused whatever the caller checked ------------------------------------------
def test_special_names_each_kind_and_passes_regular_files_folders_and_new_names(tmp_path):
    os.mkfifo(tmp_path / "p")
    os.symlink("/dev/full", tmp_path / "l")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    (tmp_path / "f").write_text("x")
    assert outputs.special(tmp_path / "p") == "a named pipe (FIFO)"
    assert outputs.special(Path("/dev/full")) == "a character device"
    assert outputs.special(tmp_path / "l") == "a link to a character device"
    for regular in ("f", "dangling", "new", "."):
        assert outputs.special(tmp_path / regular) is None, regular


def test_the_writer_refuses_a_pipe_that_was_there_or_appeared_during_the_write(tmp_path):
    pipe = tmp_path / "out.md"
    os.mkfifo(pipe)
    with pytest.raises(AttnresError, match="it is a named pipe"):
        outputs.write_text(pipe, "text\n")
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and os.listdir(tmp_path) == ["out.md"]
    late = tmp_path / "late.md"
    with pytest.raises(AttnresError, match="it is a named pipe"), outputs.atomic(late) as tmp:
        tmp.write_text("text\n")
        os.mkfifo(late)  # made by someone else while the file was written
    assert stat.S_ISFIFO(os.lstat(late).st_mode) and sorted(os.listdir(tmp_path)) == ["late.md", "out.md"]


def test_the_writer_never_replaces_a_device(tmp_path):
    before = os.lstat("/dev/full")
    with pytest.raises(AttnresError, match="it is a character device"):
        outputs.write_bytes(Path("/dev/full"), b"x")
    after = os.lstat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and (after.st_rdev, after.st_ino) == (before.st_rdev, before.st_ino)


# -- CSV formula injection (OWASP): export quotes, import unquotes ------------------------------------------
PAYLOADS = ["=cmd|' /C calc'!A0", '=HYPERLINK("http://x")', "+SUM(1+1)*cmd|' /C calc'!A0"]
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def cells(path: Path) -> list[list[str]]:
    with path.open(newline="") as fh:
        return list(csv.reader(fh))


def stored(db: Path) -> dict[tuple, tuple]:
    """Each run's free-text fields and each of its values, by (variant, seed)."""
    import sqlite3

    found = {}
    with sqlite3.connect(db) as conn:
        for variant, seed, device, message, status in conn.execute(
                "select variant, seed, device, message, status from runs"):
            found[variant, seed] = (device, message, status)
        for variant, seed, key, step, value in conn.execute(
                "select r.variant, r.seed, k.name, m.step, m.value from metrics m join runs r on r.id = m.run_id "
                "join metric_keys k on k.id = m.key_id"):
            found[variant, seed, key, step] = value
    return found


@pytest.fixture
def formulas(workdir, capsys, monkeypatch) -> Path:
    """runs.db holding runs whose label, device, message and a key are formulas (a CSV import), and one whose device
    already starts with a quote and a formula character (a JSONL import, read as it is)."""
    rows = []
    for i, (label, device, message) in enumerate([PAYLOADS, PAYLOADS[::-1], ["-x", "@SUM(1)", "\tTab"],
                                                  ["@label", "\rcr", "-1.5"]]):
        for step, value in ((10, -1.5), (20, 2.25)):
            rows.append({"run": label, "variant": "standard", "seed": i + 1, "step": step, "key": "eval_loss",
                         "value": value - i, "status": "failed", "device": device, "message": message})
            rows.append({"run": label, "variant": "standard", "seed": i + 1, "step": step, "key": "@key",
                         "value": -value, "status": "failed", "device": device, "message": message})
    pd.DataFrame(rows).to_csv(workdir / "in.csv", index=False, lineterminator="\r\n")  # (CRLF: "\rcr" is quoted)
    code, _, err = in_process(["import", "in.csv"], capsys, monkeypatch)
    assert code == 0, err
    with (workdir / "in.jsonl").open("w") as fh:
        for step in (10, 20):
            fh.write(json.dumps({"variant": "control_block", "seed": 9, "step": step, "key": "eval_loss",
                                 "value": -3.0, "device": "'=already", "message": "''+twice"}) + "\n")
    code, _, err = in_process(["import", "in.jsonl"], capsys, monkeypatch)
    assert code == 0, err
    return workdir / "runs.db"


def test_export_csv_quotes_every_cell_a_spreadsheet_would_run(formulas, workdir, capsys, monkeypatch):
    code, _, err = in_process(["export", "--format", "csv", "--out", "exp"], capsys, monkeypatch)
    assert code == 0, err
    for name in ("runs.csv", "metrics.csv"):
        for row in cells(workdir / "exp" / name)[1:]:
            for cell in row:
                if cell.startswith(FORMULA_START):  # only a plain number may start so: -1.5 is a number, not quoted
                    float(cell)
    metrics = cells(workdir / "exp" / "metrics.csv")
    head = metrics[0]
    got = [dict(zip(head, r, strict=True)) for r in metrics[1:]]
    assert {(r["device"], r["message"]) for r in got} >= {("'" + PAYLOADS[1], "'" + PAYLOADS[2]),
                                                        ("'" + PAYLOADS[1], "'" + PAYLOADS[0]),
                                                        ("'@SUM(1)", "'\tTab"), ("'\rcr", "-1.5"),
                                                        ("''=already", "'''+twice")}
    assert "-1.5" in {r["value"] for r in got} and "'@key" in {r["key"] for r in got}
    runs_rows = [dict(zip(cells(workdir / "exp" / "runs.csv")[0], r, strict=True))
                 for r in cells(workdir / "exp" / "runs.csv")[1:]]
    labels = {json.loads(r["config_json"])["imported"] for r in runs_rows}
    assert {PAYLOADS[0], PAYLOADS[2], "-x", "@label"} <= labels  # a label travels inside its JSON, not as a cell


def test_an_exported_csv_imports_back_to_the_same_values(formulas, workdir, capsys, monkeypatch):
    code, _, err = in_process(["export", "--format", "csv", "--out", "exp"], capsys, monkeypatch)
    assert code == 0, err
    code, _, err = in_process(["import", "exp/metrics.csv", "--db", "other.db"], capsys, monkeypatch)
    assert code == 0, err
    first, again = stored(formulas), stored(workdir / "other.db")
    assert again == first and first["control_block", 9][0] == "'=already"
    assert first["standard", 1] == (PAYLOADS[1], PAYLOADS[2], "failed") and first["standard", 4][:2] == ("\rcr", "-1.5")
    # the second generation's export is the first's, byte for byte: the quoting is stable
    code, _, err = in_process(["export", "--out", "exp2", "--db", "other.db"], capsys, monkeypatch)
    assert code == 0, err
    assert [r[1:] for r in cells(workdir / "exp2" / "metrics.csv")] == [r[1:] for r in
                                                                        cells(workdir / "exp" / "metrics.csv")]
    assert len(runs(workdir, "other.db")) == len(runs(workdir)) == 5


def test_parquet_is_written_as_stored(formulas, workdir, capsys, monkeypatch):
    code, _, err = in_process(["export", "--format", "parquet", "--out", "exp"], capsys, monkeypatch)
    assert code == 0, err
    frame = pd.read_parquet(workdir / "exp" / "metrics.parquet")
    assert set(frame["device"]) == {PAYLOADS[1], "@SUM(1)", "\rcr", "'=already"}
