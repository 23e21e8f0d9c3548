"""The tracker's fast paths keep what they record: one spool line a step, cached key ids, status lookups."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from helpers import cli_here, database_at, values

from attnres.runs.status_view import status_rows
from attnres.tracking import run_rows, spool, states
from attnres.tracking.db import HEAD, check_location, get_engine
from attnres.tracking.run_store import RunStore
from attnres.tracking.writer import MetricWriter
from attnres.variants.registry import resolve_run


@pytest.fixture
def engine(tmp_path):
    return get_engine(str(tmp_path / "runs.db"))


def new_run(engine, seed: int = 1, status: str = states.FINISHED) -> int:
    return run_rows.create_run(engine, resolve_run("standard", "tiny", seed), actor=states.IMPORTER, status=status)


def test_a_logged_step_is_one_spool_line_and_both_line_forms_are_read_back(engine, tmp_path):
    run = new_run(engine, status=states.QUEUED)
    path = tmp_path / "run.spool.jsonl"
    writer = MetricWriter(engine, run, path, interval=3600)
    for step in range(1, 4):
        writer.add(step, train_loss=1.0 / step, lr=0.1)
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["m"]["lr"] == 0.1
    # a spool of the per-value form (written before 2026-12) and a garbled per-step line beside good ones
    with path.open("a") as fh:
        fh.write(json.dumps({"r": run, "s": 4, "k": "train_loss", "v": 0.25}) + "\n")
        fh.write(json.dumps({"r": run, "s": 5, "m": ["not", "a", "mapping"]}) + "\n")
        fh.write(json.dumps({"r": run, "s": 6, "m": {"train_loss": 0.2, "lr": "x"}}) + "\n")
    logs, bad = spool.read(path)
    assert [(s, k) for s, k, _ in logs[run].metrics if k == "train_loss"] == [(1, "train_loss"), (2, "train_loss"),
                                                                            (3, "train_loss"), (4, "train_loss")]
    assert len(bad) == 2  # a line is taken whole or not at all
    writer.close()
    got = values(engine, run, "train_loss")
    assert got == {1: 1.0, 2: 0.5, 3: 1.0 / 3, 4: 0.25}


def test_a_locked_database_is_an_sqlalchemy_error_the_writer_retries_even_with_key_ids_cached(tmp_path):
    from sqlalchemy.exc import SQLAlchemyError

    engine = get_engine(str(tmp_path / "runs.db"), busy_s=0.2)
    run = new_run(engine)
    run_rows.log_metrics(engine, run, [(1, "a", 1.0)])  # the key's id is cached from here on
    lock = sqlite3.connect(tmp_path / "runs.db")
    lock.execute("BEGIN EXCLUSIVE")
    with pytest.raises(SQLAlchemyError, match="locked"):
        run_rows.log_steps(engine, run, [(2, {"a": 2.0})])
    lock.rollback()
    lock.close()
    run_rows.log_steps(engine, run, [(2, {"a": 2.0})])
    assert values(engine, run, "a") == {1: 1.0, 2: 2.0}


def test_cached_key_ids_follow_a_database_replaced_under_the_writer(tmp_path):
    path = tmp_path / "runs.db"
    engine = get_engine(str(path))
    run = new_run(engine)
    run_rows.log_metrics(engine, run, [(1, "train_loss", 3.0), (1, "lr", 0.1)])
    # another database at the same path, whose key ids differ: "zeta" is its first key, then the others
    other = tmp_path / "other.db"
    built = get_engine(str(other))
    assert new_run(built) == run
    run_rows.log_metrics(built, run, [(1, "zeta", 1.0)])
    run_rows.log_metrics(built, run, [(1, "lr", 9.0), (1, "train_loss", 9.0)])
    built.dispose()
    os.replace(other, path)
    check_location(engine)  # what the writer does before each write: the pool now opens the new file
    run_rows.log_metrics(engine, run, [(2, "train_loss", 2.0), (2, "lr", 0.2)])
    with sqlite3.connect(path) as conn:
        got = dict(conn.execute("select k.name || ':' || m.step, m.value from metrics m join metric_keys k "
                                "on k.id = m.key_id where m.step = 2").fetchall())
    assert got == {"train_loss:2": 2.0, "lr:2": 0.2}


def test_status_lists_the_active_runs_and_the_most_recent_with_their_latest_values(engine, tmp_path):
    queued = new_run(engine, seed=0, status=states.QUEUED)  # the oldest run, still active
    ids = [new_run(engine, seed=s) for s in range(1, 31)]
    for run in ids:
        run_rows.log_metrics(engine, run, [(s, "train_loss", 10.0 - s / 10) for s in range(1, 51)]
                          + [(25, "eval_loss", 5.0), (50, "eval_loss", float(run))])
    runs = RunStore(str(tmp_path / "runs.db"))
    rows, total = status_rows(runs, recent=20)
    assert total == 31 and [r["run"] for r in rows] == [queued, *ids[-20:]]
    last = rows[-1]
    assert (last["train loss"], last["eval loss"], last["mean tok/s"]) == ("5.000", f"{ids[-1]:.3f}", "—")
    every, _ = status_rows(runs, recent=None)
    assert [r["run"] for r in every] == [queued, *ids]


@pytest.mark.integration
def test_status_and_variants_answer_without_torch_pandas_or_sqlalchemy(engine, tmp_path):
    """Nor does status of ended runs import SQLAlchemy (half its second): over a SQLite file of this schema it
    reads on a read-only sqlite3 connection (only an active run's check opens the engine)."""
    new_run(engine, status=states.KILLED)
    with sqlite3.connect(tmp_path / "runs.db") as conn:  # (a name as imports accept it: shown as it is)
        conn.execute("update runs set experiment = 'x[/bold]y'")
    probe = ("import sys\nfrom attnres.cli.main import main\nsys.argv = ['attnres', *sys.argv[1:]]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in ('torch', 'pandas', 'numpy', 'sqlalchemy') if m in sys.modules))")
    for args in (["status", "--db", str(tmp_path / "runs.db")], ["variants"]):
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True,
                             env={**os.environ, "COLUMNS": "250"}).stdout
        assert "LOADED []" in out, (args, out[-500:])
        if args[0] == "status":
            assert "x[/bold]y" in out and "killed" in out, out
    assert "block_gqa_depth" in out and "1-3" in out  # the listing with its depth sources, from the configs


def test_the_status_reads_name_only_columns_of_the_schema():
    from attnres.tracking import status_reads
    from attnres.tracking.schema import Base

    for name, columns in status_reads.NAMED.items():
        assert set(columns) <= set(Base.metadata.tables[name].c.keys()), name


def test_status_cli_says_how_many_runs_it_left_out(workdir):
    engine = get_engine(str(workdir / "runs.db"))
    for seed in range(25):
        new_run(engine, seed=seed, status=states.KILLED)  # (a finished run with no rows would be incomplete)
    short = cli_here("status", check=True).stdout
    assert "20 of 25 runs" in short and "--all" in short
    full = cli_here("status", "--all", check=True).stdout
    assert "of 25 runs" not in full and full.count("killed") == 25


@pytest.mark.integration
def test_bench_tracker_prints_ours_beside_raw_sqlite_as_json(workdir):
    out = cli_here("bench", "tracker", "--json", "--rows", "2000", "--runs", "3", "--steps", "60",
                  "--status-runs", "30", "--repeat", "1", "--grow", "2", "--paper-steps", "250",
                  check=True).stdout
    got = json.loads(out)
    for field in ("ingest_rows_per_s", "raw_sqlite_rows_per_s", "log_call_p50_us", "log_call_p99_us",
                  "report_rows", "report_s", "status_runs", "status_s", "report_x2_s", "status_x2_s"):
        assert got[field] > 0, field
    assert got["report_rows"] == 3 * (60 * 5 + 1) and got["status_runs"] == 30 and got["ingest_rows"] == 2000
    assert got["report_x2_rows"] == 2 * got["report_rows"] and got["status_x2_runs"] == 60  # the second size
    assert got["report_growth"] == got["report_x2_s"] / got["report_s"]
    assert got["log_call_p50_us"] <= got["log_call_p99_us"]
    # the study at paper scale: 15 variants x 5 seeds, train metrics every 10 steps, an eval (and depth map) at 0, 250
    assert got["paper_runs"] == 75 and got["paper_metric_rows"] == 75 * (25 * 5 + 2)
    assert got["paper_depth_rows"] > 0 and got["paper_report_s"] > 0 and got["paper_status_s"] > 0


def test_upgrade_to_clustered_metrics_keeps_every_row(workdir):
    db = workdir / "runs.db"
    database_at(db, "0004")
    with sqlite3.connect(db) as conn:
        conn.execute("insert into metric_keys (id, name) values (1, 'eval_loss'), (2, 'train_loss')")
        conn.executemany("insert into metrics (run_id, key_id, step, value) values (1, ?, ?, ?)",
                         [(k, s, k + s / 100) for k in (1, 2) for s in range(50)])
    assert f"0004 -> {HEAD}" in cli_here("db", "upgrade", check=True).stdout
    with sqlite3.connect(db) as conn:
        table = conn.execute("select sql from sqlite_master where name = 'metrics'").fetchone()[0]
        assert conn.execute("select count(*) from mirror_marks").fetchone() == (0,)  # 0006: mirrors, --on-end
        assert {"mirrors_json", "on_end_json", "launch_id"} <= {r[1] for r in conn.execute("pragma table_info(runs)")}
        assert conn.execute("select count(*) from launches").fetchone() == (0,)  # 0007: stages, pre-registration
        assert conn.execute("select launch_id from runs").fetchall() == [(None,)]  # one first stage
        got = conn.execute("select key_id, step, value from metrics order by key_id, step").fetchall()
        indexes = {r[0] for r in conn.execute("select name from sqlite_master where type = 'index'")}
    assert "WITHOUT ROWID" in table and "ix_metrics_key_step" not in indexes
    assert got == [(k, s, k + s / 100) for k in (1, 2) for s in range(50)]
    assert "finished" in cli_here("status", check=True).stdout  # the upgraded file is in use as it is


def test_summaries_are_dropped_by_any_write_and_the_report_reads_the_same_with_or_without_them(workdir):
    from attnres.tracking.schema import MetricSummary

    engine = get_engine(str(workdir / "runs.db"))
    ids = []
    for variant, offset in (("standard", 0.0), ("control_block", -0.05)):
        for seed in (1, 2, 3):
            run = run_rows.create_run(engine, resolve_run(variant, "tiny", seed, ["steps=40"]), actor=states.IMPORTER,
                                   status=states.FINISHED)
            run_rows.log_metrics(engine, run, [(s, k, v + offset + seed / 1000 + s / 7) for s in range(0, 41, 2)
                                            for k, v in (("eval_loss", 4.0), ("train_loss", 3.0),
                                                         ("tokens_per_s", 1e4 + seed), ("peak_memory_bytes", 1e8))])
            ids.append(run)

    def summaries() -> int:
        with engine.connect() as conn:
            return len(conn.execute(MetricSummary.__table__.select()).all())

    from attnres.reports.build import write_report

    without = write_report(RunStore(str(workdir / "runs.db")), workdir / "a.md", plots=False)
    for run in ids:
        run_rows.summarize(engine, run)
    assert summaries() == 6 * 4
    assert write_report(RunStore(str(workdir / "runs.db")), workdir / "b.md", plots=False) == without
    run_rows.log_metrics(engine, ids[0], [(41, "eval_loss", 1.0)])  # a late write: that run's summaries go
    run_rows.drop_metrics_after(engine, ids[1], 40)  # a resume point: so do these
    assert summaries() == 4 * 4
    run_rows.drop_metrics_after(engine, ids[0], 40)
    assert write_report(RunStore(str(workdir / "runs.db")), workdir / "c.md", plots=False) == without


def test_a_run_that_ends_leaves_its_summaries(engine, tmp_path):
    run = new_run(engine, status=states.QUEUED)
    writer = MetricWriter(engine, run, tmp_path / "run.spool.jsonl", interval=0.05)
    for step in range(1, 11):
        writer.add(step, train_loss=10.0 - step, tokens_per_s=100.0 * step)
    assert writer.close()
    with engine.connect() as conn:
        got = {row[0]: row[1:] for row in conn.exec_driver_sql(
            "select k.name, s.n, s.mean, s.low, s.high, s.last_step from metric_summaries s "
            "join metric_keys k on k.id = s.key_id where s.run_id = ?", (run,))}
    assert got == {"train_loss": (10, 4.5, 0.0, 9.0, 10), "tokens_per_s": (10, 550.0, 100.0, 1000.0, 10)}


def test_metrics_of_a_missing_run_are_refused_whole_and_foreign_keys_stay_on(engine):
    """SQLite checks a batch's parents once instead of per row: the same refusal, nothing half written,
    and the connection keeps enforcing foreign keys afterwards."""
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    run = new_run(engine)
    with pytest.raises(IntegrityError):
        run_rows.log_steps(engine, run + 1, [(1, {"train_loss": 1.0}), (2, {"train_loss": 0.5})])
    run_rows.log_steps(engine, run, [(s, {"train_loss": 1.0, "lr": 0.1}) for s in range(3)])
    assert values(engine, run, "train_loss") == {0: 1.0, 1: 1.0, 2: 1.0}
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("select count(*) from metrics where run_id != :r"), {"r": run}).scalar() == 0
        with pytest.raises(IntegrityError):  # enforced per row again for any other statement
            conn.execute(text("insert into metrics (run_id, key_id, step, value) values (:r, 1, 9, 1.0)"),
                         {"r": run + 5})


def test_the_paper_scale_study_fills_a_scratch_database_on_the_server_and_drops_it():
    """`bench tracker --server URL` measures the study at paper scale in a database of its own on that server: made,
    filled with the study's shape (train metrics every 10 steps, evals and depth maps from step 0), dropped after."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from attnres.bench.paper import depth_keys, paper_db
    from attnres.tracking.bench_anchor import scratch_database

    server = os.environ.get("ATTNRES_TEST_PG_URL")
    if not server:
        pytest.skip("PostgreSQL not started (.ci/services.sh start sets ATTNRES_TEST_PG_URL)")
    with scratch_database(server) as url:
        name = make_url(url).database
        got = paper_db(url, variants=2, seeds=(1, 2), steps=500)
        store = RunStore(url)
        runs = [store.run(run_id) for run_id in (1, 2, 3, 4)]
        assert [(r.variant, r.seed, r.status, r.step) for r in runs] == [
            ("standard", 1, "finished", 500), ("standard", 2, "finished", 500),
            ("full_attnres", 1, "finished", 500), ("full_attnres", 2, "finished", 500)]
        assert store.holes(runs[0]) == {} and store.holes(runs[3]) == {}  # whole curves, as status checks them
        keys = depth_keys("full_attnres")
        assert got == {"paper_runs": 4, "paper_metric_rows": 4 * (50 * 5 + 3), "paper_depth_rows": 2 * 3 * len(keys)}
        assert sorted(store.depth_steps(runs[2].id)) == [0, 250, 500]
        rows, total = status_rows(store, recent=2)  # (status's plain SQL, on PostgreSQL through the engine)
        assert total == 4 and [(r["run"], r["step"], r["eval loss"] != "—") for r in rows] == [
            (3, "500/500", True), (4, "500/500", True)]
        with get_engine(url).begin() as conn:  # a hole status names: the `%` of its count, on PostgreSQL
            conn.execute(text("delete from metrics where run_id = 2 and step between 100 and 120 and key_id = "
                              "(select id from metric_keys where name = 'train_loss')"))
        assert store.missing([{"id": 2, "status": "finished", "total_steps": 500,
                               "config_json": runs[1].config_json}]) == {2: "train_loss steps 100-120"}
        store.close()
    admin = create_engine(server)
    with admin.connect() as conn:
        left = conn.execute(text("select count(*) from pg_database where datname = :n"), {"n": name}).scalar_one()
    admin.dispose()
    assert left == 0


def test_status_reads_a_current_file_read_only_and_leaves_any_other_to_the_engines_checks(engine, tmp_path):
    from attnres.tracking import DatabaseError
    from attnres.tracking.quick_reads import open_sqlite

    new_run(engine, status=states.KILLED)
    url = f"sqlite:///{tmp_path}/runs.db"
    reads = open_sqlite(url, 1.0)
    assert reads is not None and reads.all("select status from runs") == [("killed",)]
    with pytest.raises(DatabaseError, match="readonly"):  # (nothing can be written through it)
        reads.all("update runs set status = 'failed'")
    reads.close()
    assert cli_here("status", "--db", tmp_path / "runs.db", check=True).stdout.count("killed") == 1
    old = tmp_path / "old.db"
    database_at(old, "0004")  # an older schema: the engine says what to do, and nothing is changed
    before = old.read_bytes()
    assert open_sqlite(f"sqlite:///{old}", 1.0) is None
    out = cli_here("status", "--db", old)
    assert out.returncode == 2 and "attnres db upgrade" in out.stderr and old.read_bytes() == before
    assert open_sqlite(f"sqlite:///{tmp_path}/none.db", 1.0) is None and not (tmp_path / "none.db").exists()


def test_a_database_url_names_one_file_whether_or_not_sqlalchemy_parses_it(tmp_path, monkeypatch):
    """status reads the file through sqlite3, the engine through SQLAlchemy: a URL names the same file for both
    (SQLAlchemy decodes `%20`), and comes back as the string SQLAlchemy renders."""
    from pathlib import Path

    from sqlalchemy.engine import URL, make_url

    from attnres.tracking import urls

    monkeypatch.chdir(tmp_path)
    new_run(get_engine(str(tmp_path / "my runs.db")), status=states.KILLED)
    for given in ("sqlite:///my%20runs.db", "sqlite:///my runs.db", "my runs.db", f"sqlite:///{tmp_path}/my runs.db"):
        assert urls.sqlite_path(given) == tmp_path / "my runs.db", given
        assert make_url(urls.normalize_url(given)).database == str(tmp_path / "my runs.db"), given
        assert cli_here("status", "--db", given, check=True).stdout.count("killed") == 1, given
    for given in ("sqlite:///runs#1.db", "sqlite:///a@b:c.db", "sqlite:///é.db", "sqlite:///a%41.db"):
        parsed = make_url(given)
        rendered = parsed.set(database=str(Path(parsed.database).resolve())).render_as_string(hide_password=False)
        assert urls.normalize_url(given) == rendered, given
        assert urls.public_url(rendered) == URL.create("sqlite", database=parsed.set(
            database=str(Path(parsed.database).resolve())).database).render_as_string(), given
