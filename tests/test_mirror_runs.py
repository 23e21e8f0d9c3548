"""Mirrors end to end: a real run sent to real local MLflow, trackio and W&B stores as it trains, every point
read back through each tracker's own reader; a mirror that fails costs one warning, and `attnres sync
--mirror` sends what it missed, once."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers import FAST, attnres, cli_here, curve, in_process, runs
from test_mirrors import mlflow_points, wandb_read

KEYS = ["train_loss", "lr", "grad_norm", "tokens_per_s", "peak_memory_bytes", "train_flops", "eval_loss"]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def ours(workdir, run_id: int = 1) -> dict[tuple[str, int], float]:
    """Every point the run recorded in our database."""
    return {(key, step): value for key in KEYS for step, value in curve(workdir, run_id, key).items()}


def mlflow_run(uri: str, run_id: int):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.search_runs([e.experiment_id for e in client.search_experiments()],
                               filter_string=f"tags.`attnres.run_id` = '{run_id}'")
    assert len(found) == 1  # one MLflow run per attnres run, however often it was sent
    return found[0]


def trackio_points(folder, project: str) -> dict[str, dict[tuple[str, int], float]]:
    """Per trackio run of ``project``: its points, read by trackio's own reader (in a fresh process: trackio reads
    TRACKIO_DIR once, on import)."""
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S\n"
            "p = sys.argv[1]\n"
            "print(json.dumps({r: [[k, row['step'], v] for row in S.get_logs(p, r) for k, v in row.items()\n"
            "    if k not in ('step', 'timestamp')] for r in S.get_runs(p)}))")
    out = subprocess.run([sys.executable, "-c", code, project], capture_output=True, text=True, check=True,
                         env={"TRACKIO_DIR": str(folder), "PATH": "/usr/bin:/bin"}).stdout
    got = {name: {(k, s): v for k, s, v in pts} for name, pts in json.loads(out.splitlines()[-1]).items()}
    counts = {name: len(pts) for name, pts in json.loads(out.splitlines()[-1]).items()}
    assert counts == {name: len(pts) for name, pts in got.items()}  # no point twice
    return got


@pytest.mark.integration
def test_a_run_is_mirrored_to_mlflow_trackio_and_wandb_as_it_trains(workdir, monkeypatch):
    for package in ("mlflow", "trackio", "wandb"):  # (not imported here: trackio reads TRACKIO_DIR once, on import)
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (the test extra has it)")
    monkeypatch.setenv("TRACKIO_DIR", str(workdir / "trackio"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(workdir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = f"sqlite:///{workdir}/mlflow.db"
    attnres("launch", "standard", "--seeds", "42", *FAST, "--steps", "30", "--set", "log_every=1",
            "--mirror", f"mlflow={uri}", "--mirror", "trackio=attnres-test", "--mirror", "wandb=attnres-test",
            check=True)
    run = runs(workdir)[0]
    assert run["status"] == "finished" and json.loads(run["mirrors_json"]) == [
        f"mlflow={uri}", "trackio=attnres-test", "wandb=attnres-test"]
    want = ours(workdir)
    assert len(want) == 30 * 6 + 4  # every step's six values, and the evals at 0, 10, 20, 30

    mirrored = mlflow_run(uri, 1)
    assert mlflow_points(uri, mirrored.info.run_id, KEYS) == want
    assert mirrored.info.status == "FINISHED" and mirrored.data.params["train.lr"] == "0.003"
    assert mirrored.data.tags["attnres.variant"] == "standard" and mirrored.data.tags["attnres.seed"] == "42"

    (tracked,) = trackio_points(workdir / "trackio", "attnres-test").values()
    assert tracked == want

    (wandb_file,) = (workdir / "wandb").glob("offline-run-*/run-*.wandb")
    (files,) = wandb_read(workdir, wandb_file.stem.removeprefix("run-"))
    assert files["points"] == want and files["exit_code"] == 0
    assert files["config"]["train.lr"] == "0.003"
    log = (workdir / "logs" / "run-1.log").read_text()
    assert "warning: mirror" not in log  # nothing failed, nothing to warn about


@pytest.mark.integration
def test_a_failing_mirror_is_one_warning_and_sync_sends_what_it_missed_once(workdir, monkeypatch, capsys):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    (workdir / "a-file").write_text("not a folder")
    broken = f"mlflow=sqlite:///{workdir}/a-file/mlflow.db"  # a store that cannot be created
    monkeypatch.setenv("ATTNRES_MIRROR", broken)  # (the environment's mirrors, as no --mirror is given)
    cli_here("launch", "standard", "--seeds", "42", *FAST, "--steps", "20", check=True)
    run = runs(workdir)[0]
    assert run["status"] == "finished" and json.loads(run["mirrors_json"]) == [broken]
    log = (workdir / "logs" / "run-1.log").read_text()
    assert log.count(f"attnres: warning: mirror {broken} left out for run 1") == 1
    want = ours(workdir)
    assert len(want) == 20 // 2 * 6 + 3  # training and our database went on: every value is recorded

    good = f"sqlite:///{workdir}/mlflow.db"
    sent = cli_here("sync", "--mirror", f"mlflow={good}", check=True).stdout
    assert f"mirrored 1 run(s): {len(want):,} values sent" in sent
    mirrored = mlflow_run(good, 1)
    assert mlflow_points(good, mirrored.info.run_id, KEYS) == want and mirrored.info.status == "FINISHED"
    code, again, err = in_process(["sync", "--mirror", f"mlflow={good}", "--run", "1"], capsys, monkeypatch)
    assert code == 0 and "mirrored 1 run(s): 0 values sent" in again, err
    assert mlflow_points(good, mlflow_run(good, 1).info.run_id, KEYS) == want  # nothing twice

    code, _, err = in_process(["sync", "--mirror", "tensorboard"], capsys, monkeypatch)
    assert code == 2 and "bad --mirror 'tensorboard'" in err


def test_the_mirrors_of_a_database_and_of_the_environment(workdir, monkeypatch, capsys):
    from attnres.runs import orchestrator, planning
    from attnres.tracking.run_store import RunStore

    code, out, _ = in_process(["mirror", "trackio=lab", "wandb"], capsys, monkeypatch)
    assert code == 0 and "mirrors of this database: trackio=lab wandb" in out
    store = RunStore(str(workdir / "runs.db"))

    def recorded(**asked) -> list[str] | None:
        req = planning.request(["standard"], [len(runs(workdir)) + 1], "tiny", 5, **asked)
        (run_id,) = orchestrator.enqueue(store, planning.plan(store, req), req)
        mirrors = next(r for r in runs(workdir) if r["id"] == run_id)["mirrors_json"]
        return json.loads(mirrors) if mirrors else None

    assert recorded() == ["trackio=lab", "wandb"]  # the database's
    monkeypatch.setenv("ATTNRES_MIRROR", "mlflow, trackio=env")
    assert recorded() == ["mlflow", "trackio=env"]  # the environment's come first
    assert recorded(mirrors=["wandb=flag"]) == ["wandb=flag"]  # and --mirror before both
    assert recorded(mirrors=["none"]) is None  # --mirror none: not even those
    code, out, _ = in_process(["mirror", "--clear"], capsys, monkeypatch)
    assert code == 0 and "mirrors of this database: none" in out
    code, _, err = in_process(["launch", "standard", "--mirror", "mlflow="], capsys, monkeypatch)
    assert code == 2 and "bad --mirror" in err and len(err.strip().splitlines()) == 1


def test_a_resumed_attempt_sends_only_new_steps_and_sync_leaves_a_run_being_sent(workdir, monkeypatch):
    """In process, with the real writer, sender and an MLflow SQLite store: two attempts of one run, the second
    resumed from step 5 after the first reached 9; then a sync while another process holds the run's sender lock."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    from attnres.mirrors.sender import Sender
    from attnres.tracking import mirror_marks, run_rows, states
    from attnres.tracking.db import get_engine
    from attnres.tracking.run_store import RunStore
    from attnres.tracking.writer import MetricWriter
    from attnres.variants.registry import resolve_run

    tmp_path = workdir
    (workdir / "logs").mkdir()  # (where the run's spool and its senders' lock live)
    engine = get_engine(str(tmp_path / "runs.db"))
    run = run_rows.create_run(engine, resolve_run("standard", "tiny", 1))
    spec = f"mlflow=sqlite:///{tmp_path}/mlflow.db"

    def attempt(steps, resume_at=None, end=states.PREEMPTED, status=states.RUNNING) -> None:
        writer = MetricWriter(engine, run, tmp_path / "run.spool.jsonl", interval=0.05,
                              mirror=Sender(RunStore(str(tmp_path / "runs.db")), run, [spec]))
        writer.transition(status)
        if resume_at is not None:
            writer.drop_after(resume_at)
        for step in steps:
            writer.add(step, train_loss=10.0 + step + (100 if resume_at is not None else 0))
            if step % 5 == 0:
                writer.add(step, eval_loss=5.0 + step)  # a second row at the same step, as the trainer logs it
        writer.transition(end)
        assert writer.close()

    attempt(range(0, 10))
    attempt(range(6, 13), resume_at=5, end=states.FINISHED)
    got = mlflow_points(spec.removeprefix("mlflow="), mlflow_run(spec.removeprefix("mlflow="), run).info.run_id,
                        ["train_loss", "eval_loss"])
    # every step once; the re-trained 6-9 keep the first attempt's values (a tracker cannot rewrite a point)
    assert got == {**{("train_loss", s): 10.0 + s for s in range(10)},
                   **{("train_loss", s): 110.0 + s for s in range(10, 13)},
                   **{("eval_loss", s): 5.0 + s for s in (0, 5, 10)}}
    assert mirror_marks.marks(engine, run, spec) == {"train_loss": 12, "eval_loss": 10}
    assert mlflow_run(spec.removeprefix("mlflow="), run).info.status == "FINISHED"

    # a sync while another process sends the run leaves it to that process, and says so; after, nothing is missing
    from attnres.mirrors.sender import lock_path, sync
    from attnres.tracking import spool

    runs_db = RunStore(str(tmp_path / "runs.db"))
    with spool.held(lock_path(runs_db.run(run))):
        assert sync(runs_db, [spec]) == [(run, spec, "skipped: another process is sending this run now")]
    assert sync(runs_db, [spec]) == [(run, spec, 0)]
