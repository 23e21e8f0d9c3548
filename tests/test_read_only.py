"""Read verbs only read: status, report, compare, logs, inspect, export and `next` (without --launch) leave the
database's content and the logs folder's spools exactly as they were, in every state a run can be found in:
a process gone without an end, a queue gone with its runs queued, a spool the database has not taken yet, a
finished run the database lacks rows of, an incomplete run made whole meanwhile. What they show is derived:
status says what `attnres sync` will record. The one reconciler (`attnres sync`, and every write verb) then
records it.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys

import pytest
from helpers import FAST, INLINE, cli_here, runs, sha
from seed_scenario import rows as seed_rows

from attnres.tracking import run_rows, spool, states
from attnres.tracking.db import get_engine
from attnres.tracking.records import RunRecord


def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def content(db) -> list[str]:
    """The database's whole content, as SQL (rows and schema): what a write would change."""
    with sqlite3.connect(db) as conn:
        return list(conn.iterdump())


def files(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def every_state(workdir):
    """A database holding a run in each state a reconciler would change, and a pending spool.

    Runs 1-3: real (inline) runs of standard, finished. Then, by hand, as crashes leave them:
    run 1 lacks train_loss steps 4-6 (recorded finished); run 2 is recorded incomplete though whole;
    run 3 is recorded running at step 8 on this host with its trainer and torchrun gone, and its spool holds
    its last row and its end (the database was away); run 4 is queued by a queue that is gone. The seed
    document's runs (imported) beside them.
    """
    cli_here("launch", "standard", "--seeds", "1", "2", "3", "--steps", "12", *FAST, *INLINE, check=True)
    seed_rows().to_csv(workdir / "seed.csv", index=False)
    cli_here("import", workdir / "seed.csv", check=True)
    db = workdir / "runs.db"
    host = socket.gethostname()
    with sqlite3.connect(db) as conn:
        conn.execute("delete from metrics where run_id = 1 and step between 4 and 6 and key_id = "
                     "(select id from metric_keys where name = 'train_loss')")
        conn.execute("update runs set status = 'incomplete', message = 'incomplete: lacks rows' where id = 2")
        conn.execute("update runs set status = 'running', ended_at = null, exit_code = null, pid = ?, agent_pid = ?,"
                     " host = ?, step = 8 where id = 3", (dead_pid(), dead_pid(), host))
        conn.row_factory = sqlite3.Row
        one = dict(conn.execute("select * from runs where id = 1").fetchone())
        one.update(seed=4, status="queued", step=0, started_at=None, ended_at=None, exit_code=None, pid=None,
                   agent_pid=None, message=None, queue_pid=dead_pid(), queue_host=host, queue_since=one["created_at"])
        del one["id"]
        conn.execute(f"insert into runs ({', '.join(one)}) values ({', '.join('?' * len(one))})", list(one.values()))
    three = RunRecord.of(run_rows.get_run(get_engine(str(db)), 3))
    three.spool.parent.mkdir(parents=True, exist_ok=True)
    three.spool.write_text(json.dumps({"r": 3, "s": 10, "m": {"train_loss": 1.5}}) + "\n"
                           + spool.fields_line(3, {"status": states.FINISHED, "step": 12}))
    return workdir


READS = [
    ["status"], ["status", "--all"], ["status", "--watch", "--interval", "0.1"],
    ["report", "--out", "r.md", "--no-plots"], ["report", "--out", "r2.md"],
    ["compare", "block_hybrid_memory", "control_block"], ["compare", "standard", "standard", "--experiment", "x"],
    ["logs", "3"], ["logs", "1"], ["inspect", "1", "--out", "map.png"], ["export", "--out", "exported"],
    ["next"],
]


@pytest.mark.integration  # (an inline launch: real training steps)
def test_every_read_verb_leaves_the_database_and_the_spools_as_they_were(every_state):
    db = every_state / "runs.db"
    before, spools = content(db), files(every_state / "logs")
    for args in READS:
        proc = cli_here(*args)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert content(db) == before, f"attnres {' '.join(args)} changed the database"
        assert files(every_state / "logs") == spools, f"attnres {' '.join(args)} changed the logs folder"


@pytest.mark.integration
def test_status_says_what_is_not_recorded_yet_and_sync_records_it(every_state):
    shown = cli_here("status", "--all", check=True).stdout
    queued = runs(every_state)[-1]["id"]  # (after the imported runs)
    assert "running — process gone, end not recorded" in shown, shown
    assert "run 3 is recorded running, but" in shown and "`attnres sync` records its end" in shown, shown
    assert "run 1 is recorded finished, but the database lacks train_loss steps 4-6" in shown, shown
    assert "queued — its queue is gone" in shown and f"`attnres resume {queued}`" in shown, shown
    assert "free run slot" not in shown  # (no queue will take one for it)
    got = {r["id"]: r["status"] for r in runs(every_state)}
    assert [got[1], got[2], got[3], got[queued]] == ["finished", "incomplete", "running", "queued"]

    followed = cli_here("logs", "3", "-f", timeout=120)  # ends: nothing will write to it again
    assert followed.returncode == 0 and followed.stdout.splitlines()[-1].startswith(
        "attnres: run 3 is recorded running, but process "), followed.stdout + followed.stderr

    synced = cli_here("sync", check=True).stdout
    got = {r["id"]: r for r in runs(every_state)}
    assert got[1]["status"] == states.INCOMPLETE and "train_loss steps 4-6" in got[1]["message"]
    assert got[2]["status"] == states.FINISHED  # whole: finished again
    assert got[3]["status"] == states.FINISHED and got[3]["step"] == 12  # its spool's own end, not "gone"
    assert got[queued]["status"] == states.PREEMPTED
    for rid in (1, 2, 3, queued):  # (3: its spool's own end)
        assert f"run {rid} recorded {got[rid]['status']}" in synced, synced
    again = cli_here("status", "--all", check=True).stdout
    assert "not recorded" not in again and "is recorded" not in again and "queued, but" not in again, again
    assert "run 1 incomplete: incomplete: the database lacks train_loss steps 4-6" in again, again
    assert f"`attnres resume {queued}` continues them" in again, again
