"""Files that are not ours, and ends the database could not take (issue 47, items 4 and 10).

`attnres sync FILE` takes only a run's spool: anything else (a text file, the password file through a link, a
directory, a FIFO, a device, an unreadable file) is one line on stderr and exit 2, with every file byte-identical
and nothing made beside it (no .lock, no .rejects, no database). A spool is taken as before, one that a crash cut at
either end included. And `attnres status` on a database that cannot be written (immutable) says which run it shows
running has no process any more, instead of showing it running as if alive, and does not fail.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from helpers import CLI, ROOT, cli_here, metric_rows, runs, sha

from attnres.runs import planning
from attnres.tracking import spool, states
from attnres.tracking.run_store import RunStore

DEAD_PID = 2**31 - 1  # no process ever has it


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder whose database and logs folder are not made yet."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNRES_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    monkeypatch.setenv("ATTNRES_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("ATTNRES_SLOTS", str(tmp_path / "slots"))
    return tmp_path


def new_run(store: RunStore, seed: int = 1) -> int:
    return store.create_run(planning.plan(None, planning.request(["standard"], [seed]))[0].cfg)


def spool_lines(store: RunStore, run_id: int, steps: range) -> list[bytes]:
    """A run's spool as its writer writes it (the writer's own line makers): its row, then a step's values each."""
    metrics, step_line = spool.line_makers(run_id)
    lines = [spool.snapshot_line(run_id, store.run_fields(run_id))]
    for s in steps:
        lines += [metrics(s, {"train_loss": 1.0 / s, "lr": 0.001}), step_line(s)]
    return [line.encode() for line in lines]


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` (links not followed): a regular file's SHA-256, else its kind."""
    out = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        out[str(path.relative_to(root))] = sha(path) if stat.S_ISREG(mode) else stat.filemode(mode)
    return out


def refused(proc: CompletedProcess, *words: str) -> None:
    """One line on stderr, naming what was wrong; exit 2; nothing on stdout; no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "nothing was changed" in proc.stderr and all(w in proc.stderr for w in words), proc.stderr


def test_sync_refuses_every_file_that_is_not_a_spool_and_changes_nothing(here):
    (here / "t.txt").write_bytes(b"hello\n")
    passwd = Path("/etc/passwd").read_bytes() if Path("/etc/passwd").is_file() else b""
    if passwd.count(b"\n") < 2:
        passwd = b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/sbin/nologin\n"
    (here / "passwd").write_bytes(passwd)  # (a copy: were it emptied, the test fails, the machine keeps its own)
    (here / "pw").symlink_to(here / "passwd")  # as `attnres sync` of a link to the system's password file
    (here / "events.jsonl").write_bytes(b'{"level": "info", "msg": "started"}\n' * 3)  # another tool's JSON lines
    (here / "notes.md").write_bytes(b'# notes\nthe spool of run 1 looked like {"r": 1, "s": 1, "m": {}}\n')
    (here / "empty.txt").write_bytes(b"")
    (here / "folder").mkdir()
    os.mkfifo(here / "fifo")
    (here / "dangling").symlink_to(here / "gone")
    store = RunStore(str(here / "runs.db"))
    rid = new_run(store)
    good = here / "good.spool.jsonl"  # a real spool, named beside the refused files: the call refuses them all
    good.write_bytes(b"".join(spool_lines(store, rid, range(1, 4))))
    RunStore.forget_all()
    (here / "copy.db").write_bytes((here / "runs.db").read_bytes())  # a database file is not a spool either
    before = tree(here)
    cases = [(["t.txt"], "t.txt is not a run's spool", "no spool record"),
             (["pw"], f"pw (a link to {os.path.realpath(here / 'passwd')}) is not a run's spool", "its line 2"),
             (["events.jsonl"], "its line 1 is not a spool record"),
             (["notes.md"], "its line 2 is not a spool record"),
             (["empty.txt"], "empty and not named like a spool"),
             (["folder"], "folder is a directory"),
             (["fifo"], "fifo is a FIFO"),
             (["/dev/null"], "/dev/null is a device"),
             (["dangling"], "cannot read dangling", "No such file"),
             (["missing.spool.jsonl"], "cannot read missing.spool.jsonl", "No such file"),
             (["copy.db"], "copy.db is not a run's spool"),
             ([str(good), "t.txt"], "t.txt is not a run's spool"),  # one refusal: the good spool is left too
             (["t.txt", str(good)], "t.txt is not a run's spool")]
    done = threading.Event()

    def let_go() -> None:  # a sync blocked opening the FIFO would be let go (as a writer would), to fail, not hang
        while not done.wait(10):
            try:
                os.close(os.open(here / "fifo", os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

    threading.Thread(target=let_go, daemon=True).start()
    try:
        for args, *words in cases:
            start = time.monotonic()
            proc = cli_here("sync", *args, timeout=120)
            assert time.monotonic() - start < 8, args  # (nothing waits: the FIFO is never opened)
            refused(proc, *words)
            assert tree(here) == before, args  # every file byte-identical, no .lock, no .rejects, nothing new
            assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    finally:
        done.set()
    assert metric_rows(here / "runs.db", rid) == 0


@pytest.mark.integration
def test_sync_refuses_a_file_it_cannot_read_in_one_line(here):
    path = here / "locked.spool.jsonl"
    path.write_bytes(b'{"r": 1, "s": 1, "m": {"train_loss": 1.0}}\n')
    path.chmod(0)
    before = tree(here)
    command = [*CLI, "sync", str(path)]
    if os.geteuid() == 0:  # root reads any file: as root without the capabilities that override file modes
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, and no setpriv to drop CAP_DAC_OVERRIDE")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=os.environ | {"COLUMNS": "200"})
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "locked.spool.jsonl" in proc.stderr and "readable" in proc.stderr and "Traceback" not in proc.stderr
    assert tree(here) == before


def test_sync_takes_spools_as_before_a_cut_one_included(here):
    store = RunStore(str(here / "runs.db"))
    first, kept = new_run(store, 1), new_run(store, 2)
    logs = here / "logs"
    logs.mkdir()
    whole = logs / f"run-{first}.spool.jsonl"  # a whole spool in the logs folder, for `sync` alone
    whole.write_bytes(b"".join(spool_lines(store, first, range(1, 6))))
    # a spool a crash cut at both ends: the end of a line first (its start lost), the last line cut short
    lines = spool_lines(store, kept, range(1, 5))
    cut = here / "cut.spool.jsonl"
    cut.write_bytes(lines[1][len(lines[1]) // 2:] + b"".join(lines[2:]) + lines[1][:10])
    # a spool that holds only a line cut short (the disk filled at its first line), and an emptied one
    only_cut = here / "only-cut.spool.jsonl"
    only_cut.write_bytes(lines[0][:25])
    emptied = here / "emptied.spool.jsonl"
    emptied.write_bytes(b"")
    link = here / "link.jsonl"  # a link to a spool: the spool it names is read, under that spool's own lock
    target = logs / "other.spool.jsonl"
    target.write_bytes(json.dumps({"r": kept, "s": 9, "m": {"eval_loss": 2.5}}).encode() + b"\n")
    link.symlink_to(target)
    RunStore.forget_all()

    out = cli_here("sync", cut, only_cut, emptied, link, check=True).stdout
    assert f"{cut}: 6 metric rows, 2 unreadable line(s) skipped" in out  # steps 2-4's train_loss and lr
    assert f"{only_cut}: 0 metric rows, 1 unreadable line(s) skipped" in out
    assert f"{emptied}: 0 metric rows\n" in out and f"{target}: 1 metric rows" in out
    assert cut.read_bytes() == b"" and spool.rejects_of(cut).read_bytes() == (
        lines[1][len(lines[1]) // 2:] + lines[1][:10] + b"\n")
    assert only_cut.read_bytes() == b"" and spool.rejects_of(only_cut).read_bytes() == lines[0][:25] + b"\n"
    assert emptied.read_bytes() == b"" and not spool.rejects_of(emptied).exists()
    assert link.is_symlink() and target.read_bytes() == b"" and Path(f"{target}.lock").exists()
    assert not Path(f"{link}.lock").exists()
    assert metric_rows(here / "runs.db", kept) == 7  # 3 steps x (train_loss, lr), and the eval
    # `sync` alone still takes every spool of the logs folder (a folder or FIFO so named is none: passed over)
    os.mkfifo(logs / "stray.spool.jsonl")
    (logs / "folder.spool.jsonl").mkdir()
    out = cli_here("sync", check=True, timeout=120).stdout
    assert f"{whole}: 10 metric rows" in out and "synced 1 spool file(s): 10 rows" in out
    assert whole.read_bytes() == b"" and metric_rows(here / "runs.db", first) == 10


# -- status, when the database cannot record a run's end ---------------------------------------------------------
def _chattr(flag: str, path: Path) -> bool:
    return shutil.which("chattr") is not None and subprocess.run(
        ["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.mark.integration
def test_status_says_a_run_has_no_process_and_sync_records_it(here):
    """A trainer gone without recording its end (a disk-full or immutable-database fault), and a finished run whose
    rows have holes: `attnres status` only reads, so it answers alike on an immutable database and a writable one.
    It shows the run as recorded, running, says that its process is gone and its end not recorded (it once showed it
    running, as if alive), and shows the finished run's holes. `attnres sync` records both once it can write."""
    host = socket.gethostname()
    store = RunStore(str(here / "runs.db"))
    rid = new_run(store)
    store.move(rid, states.RUNNING, states.TRAINER, host=host, pid=DEAD_PID, started_at=states.now() -
               timedelta(seconds=30), heartbeat_at=states.now(), log_path=str(here / "logs" / f"run-{rid}.log"))
    holes = store.create_run(planning.plan(None, planning.request(["standard"], [2]))[0].cfg,
                             status=states.FINISHED, actor=states.IMPORTER)  # finished, without a logged row
    store.update_run(holes, step=200)
    RunStore.forget_all()
    db = here / "runs.db"
    immutable = _chattr("+i", db)
    try:
        before = sha(db)
        proc = cli_here("status")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        row = next(line for line in proc.stdout.splitlines() if line.split("│")[1:2] == [f" {rid:>3} "])
        assert "running" in row and "— process gone, end not recorded" in row
        assert (f"run {rid} is recorded running, but process {DEAD_PID} on {host} is gone without recording an "
                "end: `attnres sync` records its end") in proc.stdout
        assert f"run {holes} is recorded finished, but the database lacks train_loss steps" in proc.stdout
        assert sha(db) == before and [r["status"] for r in runs(here)] == [states.RUNNING, states.FINISHED]
        if immutable:  # the reconciler cannot write it: one line, nothing changed
            refused = cli_here("sync")
            assert refused.returncode == 2 and "readonly" in refused.stderr and "Traceback" not in refused.stderr
            assert sha(db) == before
    finally:
        if immutable:
            assert _chattr("-i", db)
    assert "— process gone, end not recorded" in cli_here("status", check=True).stdout  # writable: still only reads
    assert [r["status"] for r in runs(here)] == [states.RUNNING, states.FINISHED]
    synced = cli_here("sync", check=True).stdout
    assert f"run {rid} recorded failed" in synced and f"run {holes} recorded incomplete" in synced, synced
    assert [r["status"] for r in runs(here)] == [states.FAILED, states.INCOMPLETE]
    proc = cli_here("status", check=True)
    assert "process gone" not in proc.stdout and "is recorded" not in proc.stdout
    assert f"run {rid} failed: process {DEAD_PID} on {host} is gone without recording an end" in proc.stdout
