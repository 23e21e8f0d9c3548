"""Shared fixtures: an isolated working folder per test, the real tokenizer cache, real data; and the check that
only tests marked ``integration`` start processes. Helpers the tests share are in helpers.py."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from helpers import ROOT, processes_started, stop_leftovers

from attnres.tracking.bench_anchor import scratch_database

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
    with scratch_database(PG, prefix="attnres") as url:
        yield url


# -- only tests marked `integration` start processes ---------------------------------------------------
# `pytest -m "not integration"` is the in-process part and stays so: a test not marked that starts a process (the
# real CLI, a trainer, torchrun, a service, a multiprocessing worker) fails at its teardown, naming the command.
# Watched: the test's setup (fixtures of every scope it sets up first, so a module fixture that starts a
# service is caught on its first test), its call and its teardown.
STARTED = pytest.StashKey[list[str]]()


def _watched(item: pytest.Item) -> contextlib.AbstractContextManager[list[str] | None]:
    if item.get_closest_marker("integration") is not None:
        return contextlib.nullcontext()
    return processes_started()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _watched(item) as started:
        try:
            return (yield)
        finally:
            item.stash[STARTED] = list(started or [])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _watched(item) as started:
        try:
            return (yield)
        finally:
            item.stash.setdefault(STARTED, []).extend(started or [])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    with _watched(item) as started:
        result = yield
    every = [*item.stash.get(STARTED, []), *(started or [])]
    if every:
        pytest.fail(f"{item.nodeid} started {len(every)} process(es) but is not marked integration "
                    "(`@pytest.mark.integration`, or `pytestmark = pytest.mark.integration` for a module): "
                    + "; ".join(every[:5]), pytrace=False)
    return result


# -- the order two workers take the tests in -----------------------------------------------------------
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that start processes (the long ones) first, the in-process ones after, each part in its own order.
    Two workers take tests as they finish: with the long ones first, the suite ends on short tests, not on one
    worker's 40-s kill test while the other has nothing left. (A module fixture is then set up at most twice.)"""
    items.sort(key=lambda item: item.get_closest_marker("integration") is None)
