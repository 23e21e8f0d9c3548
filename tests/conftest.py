"""Shared fixtures: an isolated working folder per test, the real tokenizer cache, real data."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
SHARED_TIKTOKEN = ROOT.parent / "shared" / "tiktoken"
if "TIKTOKEN_CACHE_DIR" not in os.environ and SHARED_TIKTOKEN.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED_TIKTOKEN)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Triton kernels run in Triton's interpreter, on CPU tensors (read when Triton is imported); the GPU
# check (`make gpu-check`) sets TRITON_INTERPRET=0 to run them compiled on CUDA
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Tests run side by side, one per core, each with its trainers: one compute thread per process. Two
    # threads each oversubscribe the cores and OpenMP's spinning threads wait on each other (two 150-step
    # runs at once took 38 s with two threads each, 21 s with one).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Small, fast runs of the GPT-2 vocabulary (a user's default path): a narrow model, few tokens per step.
FAST_GPT2 = ["--set", "batch_size=4", "--set", "eval_batches=2", "--set", "eval_every=10",
             "--set", "log_every=2", "--set", "warmup=2", "--set", "n_layer=2", "--set", "d_model=32",
             "--set", "n_head=2", "--set", "seq_len=32"]
# The same on the built-in corpus as UTF-8 bytes (257 ids): a step is then the layers', not a 50257-wide
# output layer's, several times faster.
BYTES = ["--data", "builtin-bytes", "--set", "vocab_size=320"]
FAST = [*FAST_GPT2, *BYTES]
# Steps of a run that a test ends by a kill or a signal: it cannot finish first, however fast the machine.
LONG = "100000"


# The issue's tiny run: 150 steps, every step logged (5 values a step) and evals every 25 steps.
# The issue's run: 150 steps with the fault at step 50 (ATTNRES_FAULT_STEPS changes the length; the
# fault must still find the run going, so not much shorter).
ISSUE_STEPS = int(os.environ.get("ATTNRES_FAULT_STEPS", "150"))
ISSUE_MID = ISSUE_STEPS // 3


def issue_run(steps: int = ISSUE_STEPS) -> list[str]:
    """The issue's tiny run at ``steps`` steps: every step logged, an eval every 25 steps."""
    return ["--set", "n_layer=1", "--set", "d_model=32", "--set", "n_head=2", "--set", "batch_size=2",
            "--set", "seq_len=32", "--steps", str(steps), "--set", "log_every=1", "--set", "eval_batches=1"]


ISSUE_RUN = issue_run()
# train_loss, lr, grad_norm, tokens_per_s, peak_memory_bytes each step; eval at 0, 25, ... and the last step
ISSUE_ROWS = ISSUE_STEPS * 5 + len(set(range(0, ISSUE_STEPS + 1, 25)) | {ISSUE_STEPS})


def queue_pid(stdout: str) -> int:
    """The pid of the background queue that `attnres launch --detach` reports."""
    return int(stdout.split("(pid ")[1].split(")")[0])


def metric_rows(db: Path, run_id: int = 1) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("select count(*) from metrics where run_id = ?", (run_id,)).fetchone()[0]
    except sqlite3.OperationalError:
        return 0


@pytest.fixture(scope="session")
def builtin_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in corpus (GPT-2 tokens and bytes), prepared once for the whole session."""
    from attnres.data.prepare import Source, prepare

    root = tmp_path_factory.mktemp("data")
    prepare(Source(kind="builtin"), root / "builtin")
    prepare(Source(kind="builtin", tokenizer="bytes"), root / "builtin-bytes")
    return root


@pytest.fixture
def workdir(tmp_path: Path, builtin_data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh folder holding runs.db, logs and checkpoints; the prepared corpus is shared."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNRES_DATA", str(builtin_data))
    monkeypatch.setenv("ATTNRES_DB", str(tmp_path / "runs.db"))
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    monkeypatch.setenv("ATTNRES_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("ATTNRES_SLOTS", str(tmp_path / "slots"))  # this test's queues share these only
    yield tmp_path
    stop_leftovers(tmp_path / "runs.db")


def stop_leftovers(db: Path) -> None:
    """Kill runs a test left queued or running, so no orphan slows the tests after it."""
    if not db.exists():
        return
    from attnres.runs import orchestrator
    from attnres.tracking.db import get_engine

    try:
        orchestrator.kill(get_engine(str(db)), None)
    except Exception:  # noqa: BLE001 - a test may leave a corrupt or locked file on purpose
        pass


# -- reading what the real processes recorded, and waiting for it ----------------------------------
def runs(workdir: Path, db: str = "runs.db") -> list[dict]:
    """Every run row of the test's SQLite file, oldest first ([] before the launcher made it)."""
    if not (workdir / db).exists():
        return []
    try:
        with sqlite3.connect(f"file:{workdir / db}?mode=ro", uri=True) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute("select * from runs order by id")]
    except sqlite3.OperationalError:  # the schema is not there yet
        return []


def curve(workdir: Path, run_id: int, key: str, db: str = "runs.db") -> dict[int, float]:
    """One metric of one run: {step: value}."""
    with sqlite3.connect(workdir / db) as conn:
        return dict(conn.execute("select m.step, m.value from metrics m join metric_keys k on k.id = m.key_id "
                                 "where k.name = ? and m.run_id = ?", (key, run_id)).fetchall())


def train_steps(db: Path, run_id: int = 1) -> list[int]:
    """The steps at which a run logged train loss, in order ([] while the schema is not there)."""
    try:
        with sqlite3.connect(db) as conn:
            return [s for (s,) in conn.execute(
                "select m.step from metrics m join metric_keys k on k.id = m.key_id "
                "where k.name = 'train_loss' and m.run_id = ? order by m.step", (run_id,))]
    except sqlite3.OperationalError:
        return []


def wait_for(predicate, timeout: float = 240, every: float = 0.1):
    """Poll ``predicate`` until it returns something true (returned), or fail after ``timeout`` s.

    The limits are generous on purpose: a loaded machine is slow, and only the condition decides.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {getattr(predicate, '__name__', 'a condition')}")


def in_process(args: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """The CLI's entry point called in the test's process (no interpreter start, no imports again): its
    exit code, stdout and stderr. For commands that start no trainer; :func:`attnres` runs the real command."""
    from cli.main import main

    monkeypatch.setattr(sys, "argv", ["attnres", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as done:
        main()
    captured = capsys.readouterr()
    return done.value.code or 0, captured.out, captured.err


def attnres(*args: str, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    proc = subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ | {"COLUMNS": "200"}, cwd=os.getcwd())
    if check and proc.returncode != 0:
        raise AssertionError(f"attnres {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(params=["c", "pytorch", "triton"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every implementation of the depth-attention kernel: the C one (built here), PyTorch's, and the
    Triton one (for GPUs; here in Triton's interpreter, on CPU tensors)."""
    import torch

    from attnres.model import cpu_kernel, gpu_kernel

    if request.param == "triton":
        pytest.importorskip("triton")  # (in the dev extra: `make test` installs it)
        monkeypatch.setenv("ATTNRES_TRITON_KERNEL", "1")
        device = os.environ.get("ATTNRES_TEST_DEVICE", "cpu")
        probe = torch.zeros(1, dtype=torch.float64, device=device)
        assert gpu_kernel.applies([probe]), "the Triton kernel is not taken"
    elif request.param == "pytorch":
        monkeypatch.setenv("ATTNRES_CPU_KERNEL", "0")
    else:
        monkeypatch.delenv("ATTNRES_CPU_KERNEL", raising=False)
        if cpu_kernel._compiler() is None:
            pytest.skip("no C compiler on this machine")
        assert cpu_kernel.kernel([torch.zeros(1, dtype=torch.float64)]) is not None, "the C kernel did not build"
    return request.param


@pytest.fixture
def pg_url():
    PG = os.environ.get("ATTNRES_TEST_PG_URL")
    if not PG:
        pytest.skip("PostgreSQL not started (.ci/services.sh start sets ATTNRES_TEST_PG_URL)")
    name = f"attnres_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield PG.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def database_at(db: Path, revision: str, preset: str = "tiny") -> None:
    """A SQLite file at an older schema ``revision`` holding one finished run (of ``preset``)."""
    from alembic import command
    from sqlalchemy import create_engine

    from attnres.tracking.db import _alembic

    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        command.upgrade(_alembic(conn), revision)
        conn.exec_driver_sql(
            "insert into runs (variant, seed, preset, data, config_json, config_hash, status, total_steps, step, "
            f"created_at, world_size) values ('standard', 7, '{preset}', 'builtin', '{{}}', 'x', 'finished', 10, 10, "
            "'2026-01-01 00:00:00', 1)")
    engine.dispose()
