"""Mirrors: target specs, and each adapter against its tracker's real local store, read back point by point.

Each backend is driven from a thread that is not the main one (as the trainer's mirror thread will), offline, with
every store under a temporary folder. A backend whose package is missing is skipped.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

from attnres.errors import AttnresError
from attnres.mirrors import (
    KINDS,
    REGISTRY,
    Mirror,
    MirrorUnavailable,
    RunInfo,
    Target,
    make,
    merge_steps,
    parse,
    parse_many,
)

LONG = "x" * 7000  # over MLflow's 6000-character limit on a param value
PARAMS = {"train.lr": "0.001", "model.n_layer": "4", "variant": "block_hybrid_memory", "seed": "42", "notes": LONG}
TAGS = {"attnres.run_id": "7", "attnres.variant": "block_hybrid_memory", "attnres.seed": "42",
        "attnres.database": "/tmp/runs.db"}


def info(identity: str = "7-3fa9c2d1", params: dict[str, str] | None = None) -> RunInfo:
    """The RunInfo the trainer would give for run 7 (another identity for another run)."""
    return RunInfo(run_id=7, identity=identity, name="block_hybrid_memory s42 #7", experiment="attnres-test",
                   params=dict(PARAMS if params is None else params), tags=dict(TAGS))


def trainer_rows(start: int, stop: int, keys: int = 3, eval_every: int | None = 25) -> list[tuple[int, dict]]:
    """Rows as the trainer logs them: a train row per step, and at every eval step a separate eval row after it."""
    names = ["train_loss", "lr", "tokens_per_s", "grad_norm", "peak_memory_bytes"][:keys]
    rows: list[tuple[int, dict]] = []
    for step in range(start, stop):
        values = {name: 1.0 / (step + 1) + i for i, name in enumerate(names)}
        if step == 123:
            values["train_loss"] = math.nan  # a non-finite value is sent and kept, not dropped
        rows.append((step, values))
        if eval_every and step % eval_every == 0:
            rows.append((step, {"eval_loss": 2.0 + step / 1000}))
    return rows


def batches(rows: list[tuple[int, dict]], size: int = 40) -> list[list[tuple[int, dict]]]:
    """``rows`` as the mirror thread gets them, in pieces; one piece starts with an eval row, apart from its step's
    train row, as happens when a batch is cut between the two."""
    evals = [i for i, (step, values) in enumerate(rows) if "eval_loss" in values and step >= 100]
    cut = evals[0] if evals else len(rows)
    out: list[list[tuple[int, dict]]] = []
    for part in (rows[:cut], rows[cut:]):
        out += [part[i:i + size] for i in range(0, len(part), size)]
    return out


def points(rows: list[tuple[int, dict]]) -> dict[tuple[str, int], float]:
    """Every (key, step) -> value the rows hold."""
    return {(key, step): value for step, values in rows for key, value in values.items()}


def assert_same(got: dict[tuple[str, int], float], want: dict[tuple[str, int], float]) -> None:
    """The same points and values (NaN equal to NaN)."""
    assert sorted(got) == sorted(want)
    bad = [k for k in want if not (got[k] == want[k] or (math.isnan(got[k]) and math.isnan(want[k])))]
    assert not bad, [(k, got[k], want[k]) for k in bad[:5]]


def in_thread(fn) -> None:
    """Run ``fn`` in a thread that is not the main thread; its exception is raised here."""
    errors: list[BaseException] = []

    def body() -> None:
        assert threading.current_thread() is not threading.main_thread()
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 -- raised again in the calling thread
            errors.append(e)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def send(mirror: Mirror, run: RunInfo, rows: list[tuple[int, dict]], status: str = "finished") -> None:
    """open, log in pieces, end: all from a background thread."""

    def go() -> None:
        mirror.open(run)
        for part in batches(rows):
            mirror.log(part)
        mirror.end(status)

    in_thread(go)


# --- specs -------------------------------------------------------------------------------------------------------


def test_parse_and_round_trip():
    assert parse("mlflow") == Target("mlflow", None)
    assert parse(" mlflow=sqlite:////abs/x.db ") == Target("mlflow", "sqlite:////abs/x.db")
    # a store named by a relative path is made absolute where it is given (a trainer or sync may run elsewhere)
    assert parse("mlflow=sqlite:///x.db") == Target("mlflow", f"sqlite:///{Path.cwd() / 'x.db'}")
    assert parse("mlflow=./mlruns") == Target("mlflow", str(Path.cwd() / "mlruns"))
    assert parse("mlflow=databricks") == Target("mlflow", "databricks")  # a name, not a path
    assert parse("mlflow=http://host:5000/?a=b") == Target("mlflow", "http://host:5000/?a=b")
    assert parse("trackio=proj") == Target("trackio", "proj")
    assert parse("WandB = team-proj") == Target("wandb", "team-proj")
    for spec in ["mlflow", "mlflow=sqlite:////x.db", "trackio", "trackio=p", "wandb", "wandb=p"]:
        assert parse(spec).spec() == spec
        assert parse(parse(spec).spec()) == parse(spec)
    for bad in ["foo", "mlflow=", "wandb = ", "", "none", "ml flow", "foo\nbar"]:
        with pytest.raises(AttnresError) as e:
            parse(bad)
        message = str(e.value)
        assert "\n" not in message and "mlflow[=URI], trackio[=PROJECT] or wandb[=PROJECT]" in message


def test_parse_many():
    assert parse_many("mlflow, wandb=p  trackio,mlflow") == [Target("mlflow", None), Target("wandb", "p"),
                                                              Target("trackio", None)]
    assert parse_many(["mlflow=sqlite:////a,b.db", "mlflow=sqlite:////a,b.db", " trackio "]) == [
        Target("mlflow", "sqlite:////a,b.db"), Target("trackio", None)]
    assert parse_many("none") == parse_many(" NONE ") == parse_many(["none"]) == parse_many("") == []
    with pytest.raises(AttnresError):
        parse_many("none, mlflow")
    with pytest.raises(AttnresError):
        parse_many("mlflow,bogus")
    with pytest.raises(AttnresError):
        make(Target("bogus", None))
    assert tuple(REGISTRY) == KINDS
    assert merge_steps([(1, {"a": 1.0}), (1, {"b": 2.0}), (2, {"a": 3.0}), (1, {"a": 4.0})]) == [
        (1, {"a": 1.0, "b": 2.0}), (2, {"a": 3.0}), (1, {"a": 4.0})]


def test_missing_package_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)  # `import trackio` now raises ImportError
    monkeypatch.delitem(sys.modules, "attnres.mirrors.trackio", raising=False)
    with pytest.raises(MirrorUnavailable) as e:
        make(parse("trackio"))
    assert str(e.value).count("\n") == 0 and "pip install attnres[trackio]" in str(e.value)


# --- MLflow ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow SQLite store for the module: creating its tables takes seconds."""
    pytest.importorskip("mlflow")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # offline: no usage reports
        yield f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def mlflow_runs(uri: str, identity: str) -> list:
    """The MLflow runs tagged with ``identity`` in the test experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("attnres-test")
    return client.search_runs([experiment.experiment_id], filter_string=f"tags.`attnres.identity` = '{identity}'")


def mlflow_points(uri: str, run_id: str, keys: list[str]) -> dict[tuple[str, int], float]:
    """Every point of the run's metric ``keys``, read with MLflow's own client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    got: dict[tuple[str, int], float] = {}
    for key in keys:
        for metric in client.get_metric_history(run_id, key):
            assert (key, metric.step) not in got
            got[(key, metric.step)] = metric.value
    return got


def test_mlflow_sends_every_point(mlflow_uri):
    import attnres.mirrors.mlflow as adapter

    assert "site-packages" in sys.modules["mlflow"].__file__  # the package, not the adapter module
    assert adapter.__name__ == "attnres.mirrors.mlflow"
    rows = trainer_rows(0, 300)
    mirror = make(parse(f"mlflow={mlflow_uri}"))
    assert isinstance(mirror, Mirror)
    send(mirror, info(), rows)
    [run] = mlflow_runs(mlflow_uri, "7-3fa9c2d1")
    assert run.info.status == "FINISHED" and run.info.run_name == "block_hybrid_memory s42 #7"
    assert run.data.params == {**PARAMS, "notes": LONG[:6000]}
    assert run.data.tags.items() >= {**TAGS, "attnres.status": "finished"}.items()
    want = points(rows)
    assert_same(mlflow_points(mlflow_uri, run.info.run_id, sorted({k for k, _ in want})), want)


def test_mlflow_continues_the_same_run(mlflow_uri):
    first, second = trainer_rows(0, 100), trainer_rows(100, 200)
    send(make(parse(f"mlflow={mlflow_uri}")), info("8-continued"), first, status="preempted")
    [run] = mlflow_runs(mlflow_uri, "8-continued")
    assert run.info.status == "RUNNING"  # preempted: left running, to be resumed
    # the resumed run: one param changed (MLflow cannot change it: kept) and one new (added)
    changed = {**PARAMS, "train.lr": "0.002", "train.steps": "200"}
    send(make(parse(f"mlflow={mlflow_uri}")), info("8-continued", changed), second, status="killed")
    [again] = mlflow_runs(mlflow_uri, "8-continued")
    assert again.info.run_id == run.info.run_id and again.info.status == "KILLED"
    assert again.data.params["train.lr"] == "0.001" and again.data.params["train.steps"] == "200"
    want = points(first + second)
    assert_same(mlflow_points(mlflow_uri, run.info.run_id, sorted({k for k, _ in want})), want)


def test_mlflow_time_for_a_long_run(mlflow_uri):
    rows = trainer_rows(0, 6000, keys=5, eval_every=None)
    mirror = make(parse(f"mlflow={mlflow_uri}"))
    started = time.perf_counter()
    in_thread(lambda: (mirror.open(info("9-timing")), mirror.log(rows), mirror.end("finished")))
    took = time.perf_counter() - started
    print(f"\nMLflow mirror: 6000 steps x 5 keys ({len(points(rows))} points) in {took:.1f} s")
    [run] = mlflow_runs(mlflow_uri, "9-timing")
    assert len(mlflow_points(mlflow_uri, run.info.run_id, ["train_loss"])) == 6000


# --- trackio -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trackio_dir(tmp_path_factory) -> Path:
    """trackio's store for the module. trackio reads TRACKIO_DIR once, on import, so it is set before that."""
    path = tmp_path_factory.mktemp("trackio")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACKIO_DIR", str(path))
        pytest.importorskip("trackio")
        from trackio import utils

        if Path(utils.TRACKIO_DIR) != path:
            pytest.skip("trackio was imported before with another TRACKIO_DIR (it reads it once, on import)")
        yield path


def trackio_points(project: str, name: str) -> dict[tuple[str, int], float]:
    """Every point of the trackio run, read with trackio's own storage reader."""
    from trackio.sqlite_storage import SQLiteStorage

    got: dict[tuple[str, int], float] = {}
    for row in SQLiteStorage.get_logs(project, name):
        for key, value in row.items():
            if key not in ("step", "timestamp"):
                assert (key, row["step"]) not in got
                got[(key, row["step"])] = value
    return got


def test_trackio_sends_every_point(trackio_dir):
    from trackio.sqlite_storage import SQLiteStorage

    rows = trainer_rows(0, 300)
    send(make(parse("trackio=mirror-test")), info(), rows)
    name = "block_hybrid_memory s42 #7 [7-3fa9c2d1]"
    assert_same(trackio_points("mirror-test", name), points(rows))
    assert SQLiteStorage.get_run_config("mirror-test", name).items() >= {**PARAMS, **TAGS}.items()


def test_trackio_continues_the_same_run(trackio_dir):
    from trackio.sqlite_storage import SQLiteStorage

    first, second = trainer_rows(0, 100), trainer_rows(100, 200)
    send(make(parse("trackio")), info("8-continued"), first, status="preempted")
    send(make(parse("trackio")), info("8-continued"), second)
    name = "block_hybrid_memory s42 #7 [8-continued]"
    assert SQLiteStorage.get_runs("attnres-test") == [name]  # the default project: run.experiment
    assert_same(trackio_points("attnres-test", name), points(first + second))


# --- W&B ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory) -> Path:
    """An offline W&B folder for the module. W&B reads its WANDB_* variables once per process (the first
    ``wandb.setup``/``wandb.init``) and ignores later changes, so one folder serves every test; runs differ by id."""
    wandb = pytest.importorskip("wandb")
    path = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(path))
        mp.setenv("WANDB_SILENT", "true")
        mp.delenv("WANDB_PROJECT", raising=False)
        settings = wandb.setup().settings
        if Path(settings.root_dir) != path or settings.mode != "offline":
            pytest.skip("W&B was set up before in this process with other settings (it reads them once)")
        yield path


def wandb_records(path: Path) -> list:
    """The records of an offline ``.wandb`` file: a 7-byte header, then LevelDB-log records in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, payloads, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:  # FULL
            payloads.append(payload)
        elif kind == 2:  # FIRST
            pending = payload
        elif kind == 3:  # MIDDLE
            pending += payload
        elif kind == 4:  # LAST
            payloads.append(pending + payload)
        else:
            assert kind == 0 and length == 0, f"record type {kind} at {pos}"
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def wandb_read(root: Path, run_id: str) -> list[dict]:
    """Per offline run file of ``run_id`` (oldest first): its points, config, summary and exit code, once every
    file holds its exit record. wandb-core's writer is a process of its own: on a loaded machine the file's last
    block can land a moment after ``finish()`` returned, so this polls (a generous limit), never sleeps a fixed time."""
    from helpers import wait_for

    found: list[dict] = []

    def complete() -> bool:
        try:
            found[:] = _wandb_files(root, run_id)
        except Exception:  # noqa: BLE001 (a block still being written fails to parse in any of several ways: read again)
            return False
        return bool(found) and all(f["exit_code"] is not None for f in found)

    try:
        wait_for(complete, timeout=60)
    except AssertionError:
        return _wandb_files(root, run_id)  # (the caller's assertions then say what is missing)
    return found


def _wandb_files(root: Path, run_id: str) -> list[dict]:
    out = []
    for path in sorted((root / "wandb").glob(f"offline-run-*/run-{run_id}.wandb")):
        got: dict[tuple[str, int], float] = {}
        config, summary, exit_code, ids = {}, {}, None, set()
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
                config.update({item_key(i): json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                config.update({item_key(i): json.loads(i.value_json) for i in record.config.update})
            elif kind == "summary":
                summary.update({item_key(i): json.loads(i.value_json) for i in record.summary.update})
            elif kind == "exit":
                exit_code = record.exit.exit_code
            elif kind == "history":
                values = {item_key(i): json.loads(i.value_json) for i in record.history.item}
                step = values.pop("_step")
                for key, value in values.items():
                    if not key.startswith("_"):
                        assert (key, step) not in got
                        got[(key, step)] = value
        out.append({"points": got, "config": config, "summary": summary, "exit_code": exit_code, "ids": ids})
    return out


@pytest.mark.integration  # (wandb records through its wandb-core service, a process)
def test_wandb_sends_every_point(wandb_dir, capfd):
    rows = trainer_rows(0, 300)
    send(make(parse("wandb=mirror-test")), info(), rows)
    [run] = wandb_read(wandb_dir, "7-3fa9c2d1")
    assert run["ids"] == {"7-3fa9c2d1"} and run["exit_code"] == 0
    assert_same(run["points"], points(rows))
    assert run["config"].items() >= {**PARAMS, **TAGS}.items()
    assert run["summary"]["attnres_status"] == "finished"
    assert capfd.readouterr().out == ""  # W&B neither prints nor wraps stdout


@pytest.mark.integration  # (wandb records through its wandb-core service, a process)
def test_wandb_continues_the_same_id(wandb_dir):
    from attnres.mirrors.wandb import run_id

    first, second = trainer_rows(0, 100), trainer_rows(100, 200)
    send(make(parse("wandb")), info("8/continued"), first, status="preempted")
    mirror = make(parse("wandb"))
    # the steps already sent (and one going back) are skipped, not given to W&B to refuse
    send(mirror, info("8/continued"), [*second[:3], (50, {"train_loss": 9.0}), *second[3:]])
    assert mirror._last_step == 199
    wid = run_id("8/continued")
    assert wid == run_id("8/continued") != run_id("8-continued") and wid.startswith("8-continued-")
    runs = wandb_read(wandb_dir, wid)
    # offline, a continued run is a second file with the same id (`wandb sync` joins them)
    assert len(runs) == 2 and all(r["ids"] == {wid} for r in runs)
    assert [r["exit_code"] for r in runs] == [1, 0]
    assert_same(runs[0]["points"] | runs[1]["points"], points(first + second))
