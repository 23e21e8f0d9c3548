"""`attnres db upgrade` is all or nothing (issue 34): killed at any point, or failing, it leaves the database
as it was; a rerun finishes it; the copy of the file made first is named, and kept. A file that an upgrade
by an earlier attnres left half done is completed, put back from its copy, or refused in one line."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
from helpers import CLI, cli_here, database_at, metric_rows, sha, wait_for

from attnres.tracking.db import _ADDS, HEAD

ROWS = 500_000  # metric rows: the upgrade's copy of them (0005) takes about a second
BACKUP_LINE = "backup of the database before the upgrade: "


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNRES_DB", str(tmp_path / "runs.db"))
    return tmp_path


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pre-Alembic file (revision 0001, no alembic_version table) with one run of ROWS metric rows."""
    db = tmp_path_factory.mktemp("big") / "runs.db"
    database_at(db, "0001")
    with sqlite3.connect(db) as conn:
        conn.execute("drop table alembic_version")
        conn.execute("insert into metric_keys (id, name) values (1, 'train_loss'), (2, 'lr')")
        conn.executemany("insert into metrics (run_id, key_id, step, value) values (1, ?, ?, ?)",
                         ((1 + i % 2, i // 2, i * 0.5) for i in range(ROWS)))
    return db


def backups(db: Path) -> list[Path]:
    return sorted(db.parent.glob(db.name + ".before-upgrade-*"))


def complete(db: Path) -> list[Path]:
    return [p for p in backups(db) if ".partial" not in p.name]


def start_upgrade(db: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "db", "upgrade", "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def schema(db: Path) -> set[tuple[str, str]]:
    """Every table, index and column of the file, and its stamp: (kind or table, name or revision)."""
    with sqlite3.connect(db) as conn:  # (a hot journal left by a kill is rolled back here)
        got = set(conn.execute("select type, name from sqlite_master"))
        tables = [name for kind, name in got if kind == "table"]
        got |= {(t, r[1]) for t in tables for r in conn.execute(f'pragma table_info("{t}")')}
        if "alembic_version" in tables:
            got |= {("alembic_version", v) for (v,) in conn.execute("select version_num from alembic_version")}
    return got


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


# Where the kill lands: each waits for its moment, or for the upgrade to end first (a fast machine): the
# assertions after it hold wherever it lands, before, during or after the upgrade.
KILL_AT = {
    "copying": lambda db: any(".partial" in p.name for p in backups(db)),  # the copy of the file half made
    "copied": lambda db: bool(complete(db)),  # the copy made, the migrations begun
    "migrating": lambda db: size(db) + size(db.with_name(db.name + "-wal")) > ORIGINAL[db] * 1.3,  # 0005's copy
}
ORIGINAL: dict[Path, int] = {}


@pytest.mark.integration
@pytest.mark.parametrize(("point", "journal"), [("copying", "delete"), ("copied", "delete"),
                                                ("migrating", "delete"), ("migrating", "wal")])
def test_a_killed_upgrade_leaves_the_file_as_it_was_and_a_rerun_finishes_it(here, big, point, journal):
    db = here / "runs.db"
    shutil.copy(big, db)
    if journal == "wal":  # (files made by an earlier attnres at its newest schema are in WAL mode)
        with sqlite3.connect(db) as conn:
            conn.execute("pragma journal_mode=wal")
    ORIGINAL[db] = size(db)
    first = schema(db)
    proc = start_upgrade(db)
    wait_for(lambda: KILL_AT[point](db) or proc.poll() is not None, timeout=120, every=0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    landed = "after the upgrade" if proc.returncode == 0 else "during it"
    interrupted = Path(f"{db}.upgrading").exists()  # (the kill found the upgrade between copy and commit)
    now = schema(db)  # all or nothing: wholly as it was, or wholly upgraded
    assert now == first or ("alembic_version", HEAD) in now, now - first
    assert metric_rows(db, None) == ROWS

    again = cli_here("db", "upgrade", "--db", str(db))
    assert again.returncode == 0, f"killed {landed} at {point}: {again.stdout}{again.stderr}"
    assert f"-> {HEAD}" in again.stdout
    if interrupted:
        assert "an earlier upgrade of this file" in again.stdout, again.stdout
    status = cli_here("status", "--db", str(db), check=True).stdout
    assert "finished" in status
    assert metric_rows(db, None) == ROWS  # every metric row is there
    with sqlite3.connect(db) as conn:
        assert conn.execute("select version_num from alembic_version").fetchall() == [(HEAD,)]
        assert "WITHOUT ROWID" in conn.execute("select sql from sqlite_master where name = 'metrics'").fetchone()[0]
    # one copy of the file as it was, named where it is; no half copy, no marker left
    kept = complete(db)
    assert len(kept) == 1 and backups(db) == kept and not Path(f"{db}.upgrading").exists()
    assert str(kept[0]) in (again.stdout + proc.stdout.read()).replace("\n", "")
    assert metric_rows(kept[0], None) == ROWS
    with sqlite3.connect(kept[0]) as conn:
        assert "alembic_version" not in {r[0] for r in conn.execute("select name from sqlite_master")}
    print(f"kill at {point} ({journal}): landed {landed}, {'an' if interrupted else 'no'} upgrade under way")


def test_a_migration_failing_late_leaves_the_file_byte_identical_and_names_the_copy(here, big):
    db = here / "runs.db"
    shutil.copy(big, db)
    with sqlite3.connect(db) as conn:  # 0006's stamp fails: after 0002-0005 (the copy of every metric row) ran
        conn.execute("create table alembic_version (version_num varchar(32) not null primary key)")
        conn.execute("insert into alembic_version values ('0001')")
        conn.execute("create trigger stop before update on alembic_version when new.version_num = '0006' "
                     "begin select raise(abort, 'stopped by the test'); end")
    before = sha(db)
    proc = cli_here("db", "upgrade", "--db", str(db))
    assert proc.returncode == 2 and "stopped by the test" in proc.stderr and "rolled back" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert sha(db) == before  # byte for byte as it was
    (kept,) = complete(db)
    assert str(kept) in proc.stderr and f"{BACKUP_LINE}{kept}" in proc.stdout.replace("\n", "")
    assert metric_rows(kept, None) == ROWS and not Path(f"{db}.upgrading").exists()


def test_a_migration_refusing_leaves_the_file_byte_identical(here):
    db = here / "runs.db"
    database_at(db, "0001")
    with sqlite3.connect(db) as conn:  # two active runs of one config: 0003 refuses, after 0002 ran
        for _ in range(2):
            conn.execute("insert into runs (variant, seed, preset, data, config_json, config_hash, status, "
                         "total_steps, step, created_at, world_size) values ('standard', 1, 'tiny', 'builtin', "
                         "'{}', 'twin', 'queued', 10, 0, '2026-01-01 00:00:00', 1)")
    before = sha(db)
    proc = cli_here("db", "upgrade")
    assert proc.returncode == 2 and "active twins" in proc.stderr and "rolled back" in proc.stderr
    assert sha(db) == before
    (kept,) = complete(db)
    assert str(kept) in proc.stderr


def test_a_stamp_lost_by_an_earlier_attnres_is_one_line_then_upgraded(here):
    """The issue's wedge: an empty alembic_version table (the old upgrade committed its CREATE only)."""
    db = here / "runs.db"
    database_at(db, "0001")
    with sqlite3.connect(db) as conn:
        conn.execute("delete from alembic_version")
    proc = cli_here("status")
    assert proc.returncode == 2 and "half-upgraded" in proc.stderr and "attnres db upgrade" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "no such column" not in proc.stderr
    out = cli_here("db", "upgrade", check=True).stdout
    assert "taken as revision 0001" in out and f"0001 -> {HEAD}" in out
    assert "finished" in cli_here("status", check=True).stdout


def test_a_migration_begun_by_an_earlier_attnres_is_made_again(here):
    """The old upgrade also committed the first migration's leading DDL: its columns and tables are dropped
    and made again, in the one transaction."""
    db = here / "runs.db"
    database_at(db, "0005")
    with sqlite3.connect(db) as conn:
        conn.execute("alter table runs add column mirrors_json text")
        conn.execute("create table mirror_marks (run_id integer)")
        conn.execute("create table _alembic_tmp_runs (id integer)")
    assert "half-upgraded" in cli_here("status").stderr
    out = cli_here("db", "upgrade", check=True).stdout
    assert "runs.mirrors_json" in out and "mirror_marks" in out and f"0005 -> {HEAD}" in out
    assert "finished" in cli_here("status", check=True).stdout


def test_a_file_it_cannot_repair_is_refused_unchanged_or_put_back_from_its_copy(here):
    db = here / "runs.db"
    database_at(db, "0001")
    good = here / "good.db"
    shutil.copy(db, good)
    with sqlite3.connect(db) as conn:  # objects of 0004 in a file stamped 0001: not the next revision's
        conn.execute("alter table runs add column experiment text")
    before = sha(db)
    proc = cli_here("db", "upgrade")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "runs.experiment (0004)" in proc.stderr and "put back the copy" in proc.stderr
    assert sha(db) == before and backups(db) == []  # refused before any copy
    # an upgrade of ours interrupted with its copy there (the marker names it): the copy is put back
    kept = here / "runs.db.before-upgrade-0001-20260101-000000"
    shutil.copy(good, kept)
    Path(f"{db}.upgrading").write_text(json.dumps({"backup": str(kept), "from": "0001"}))
    out = cli_here("db", "upgrade", check=True).stdout
    assert f"put back the copy made before it, {kept}" in out and f"0001 -> {HEAD}" in out
    assert complete(db) == [kept] and not Path(f"{db}.upgrading").exists()
    assert "finished" in cli_here("status", check=True).stdout


def test_what_each_revision_adds_is_in_a_new_database(here):
    """`_ADDS` (what tells a half-upgraded file) has every revision after 0001, and names what is there."""
    from attnres.tracking.db import get_engine

    assert sorted(_ADDS) == [f"{r:04d}" for r in range(2, int(HEAD) + 1)]
    get_engine(str(here / "new.db")).dispose()
    with sqlite3.connect(here / "new.db") as conn:
        names = {r[0] for r in conn.execute("select name from sqlite_master")}
        columns = {r[1] for r in conn.execute("pragma table_info(runs)")}
        assert conn.execute("select version_num from alembic_version").fetchall() == [(HEAD,)]
    for cols, objs in _ADDS.values():
        assert set(cols) <= columns and set(objs) <= names
