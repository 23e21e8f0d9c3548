"""Planning a launch in process: what is checked at parse time, and what a relaunch does with each cell."""

from __future__ import annotations

import re

import pytest

from attnres.errors import AttnresError
from attnres.runs import backends, orchestrator, planning
from attnres.runs.backends import Placement
from attnres.runs.backends.slurm import SlurmOptions
from attnres.tracking import states
from attnres.tracking.run_store import RunStore


@pytest.mark.parametrize("kwargs,message", [
    ({"seeds": [1, 1]}, "repeats a seed"),
    ({"variants": ["standard", "baseline"]}, "same variant twice"),
    ({"variants": ["nosuch"]}, "unknown variant 'nosuch'"),
    ({"backend": "k8s"}, "unknown backend 'k8s'"),
    ({"kill_if_worse_than": "standard"}, "needs --at-step"),
    ({"preset": "huge"}, "unknown preset 'huge'"),
    ({"overrides": ["n_layers=2"]}, "did you mean 'n_layer'"),
    ({"placement": Placement(nproc=0)}, "--nproc"),
    ({"backend": "slurm", "placement": Placement(options=SlurmOptions(time_limit="forever"))}, "bad --time"),
])
def test_a_bad_request_is_refused_before_anything_is_recorded(kwargs, message):
    args = {"variants": ["standard"], "seeds": [1]} | kwargs
    with pytest.raises(AttnresError, match=message):
        planning.request(**args)


def test_a_relaunch_skips_finished_and_active_cells_and_continues_interrupted_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    store = RunStore(str(tmp_path / "runs.db"))
    req = planning.request(["standard", "control_block"], [1, 2, 3], steps=5)
    cells = planning.plan(store, req)
    assert [c.skip or c.run_id for c in cells] == [None] * 6
    ids = orchestrator.enqueue(store, cells, req)
    assert ids == [1, 2, 3, 4, 5, 6] and all(store.status_of(i) == states.QUEUED for i in ids)
    store.move(1, states.FINISHED, states.TRAINER)
    store.move(2, states.FAILED, states.TRAINER, message="boom", exit_code=1)
    store.move(3, states.KILLED, states.USER)
    store.move(4, states.RUNNING, states.TRAINER)
    again = planning.plan(store, req)
    assert [(c.skip or "").split(" ")[0] or c.run_id for c in again] == ["finished", 2, 3, "already", "already",
                                                                          "already"]
    assert orchestrator.enqueue(store, again, req) == [2, 3]  # only the interrupted ones run again
    r = store.run(2)
    assert (r.status, r.message, r.exit_code) == (states.QUEUED, None, None)  # the old failure is cleared
    forced = planning.plan(store, planning.request(["standard"], [1], steps=5, force=True))
    assert forced[0].skip is None and forced[0].run_id is None


def test_resume_refuses_runs_that_are_not_interrupted_and_changes_nothing(tmp_path):
    store = RunStore(str(tmp_path / "runs.db"))
    req = planning.request(["standard"], [1, 2], steps=5)
    a, b = orchestrator.enqueue(store, planning.plan(store, req), req)
    store.move(a, states.FAILED, states.SUPERVISOR)
    with pytest.raises(AttnresError, match=f"run {b} is queued"):
        orchestrator.reopen(store, [a, b])
    assert store.status_of(a) == states.FAILED  # checked all before changing any
    assert orchestrator.reopen(store, [a]) == [f"run {a} (standard, seed 1): no checkpoint: starting over from step 0"]
    assert store.status_of(a) == states.QUEUED


@pytest.mark.parametrize(("backend", "given", "message"), [
    ("slurm", {"x": "1"}, "--x is not an option of the slurm backend (its options: --nodes, --gpus-per-node, "
                          "--partition, --time)"),
    ("local", {"partition": "gpu"}, "--partition is not an option of the local backend (its options: "
                                    "--gpus-per-run)"),
    ("local", {"nodes": 2}, "--nodes is not an option of the local backend"),
    ("slurm", {"nodes": "two"}, "--nodes 'two': not a valid int"),
])
def test_each_backend_takes_its_own_typed_options(backend, given, message):
    with pytest.raises(AttnresError, match=re.escape(message)):
        backends.get(backend).placement(1, given)


def test_options_given_as_text_get_their_types():
    p = backends.get("slurm").placement(2, {"nodes": "3", "gpus_per_node": 8, "time_limit": "1:00:00"})
    assert p == Placement(2, SlurmOptions(nodes=3, gpus_per_node=8, time_limit="1:00:00"))
    assert backends.get("local").placement(1, {}).option("gpus_per_run") == 1
