"""Planning a launch in process: what is checked at parse time, and what a relaunch does with each cell."""

from __future__ import annotations

import re

import pytest

from attnres.errors import AttnresError
from attnres.runs import backends, orchestrator, planning
from attnres.runs.backends import Placement
from attnres.runs.backends.slurm import SlurmOptions
from attnres.tracking import states, store
from attnres.tracking.db import get_engine


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
    engine = get_engine(str(tmp_path / "runs.db"))
    req = planning.request(["standard", "control_block"], [1, 2, 3], steps=5)
    cells = planning.plan(engine, req)
    assert [c.skip or c.run_id for c in cells] == [None] * 6
    ids = orchestrator.enqueue(engine, cells, req)
    assert ids == [1, 2, 3, 4, 5, 6] and all(store.status_of(engine, i) == states.QUEUED for i in ids)
    states.transition(engine, 1, states.FINISHED, states.TRAINER)
    states.transition(engine, 2, states.FAILED, states.TRAINER, message="boom", exit_code=1)
    states.transition(engine, 3, states.KILLED, states.USER)
    states.transition(engine, 4, states.RUNNING, states.TRAINER)
    again = planning.plan(engine, req)
    assert [(c.skip or "").split(" ")[0] or c.run_id for c in again] == ["finished", 2, 3, "already", "already",
                                                                          "already"]
    assert orchestrator.enqueue(engine, again, req) == [2, 3]  # only the interrupted ones run again
    r = store.get_run(engine, 2)
    assert (r.status, r.message, r.exit_code) == (states.QUEUED, None, None)  # the old failure is cleared
    forced = planning.plan(engine, planning.request(["standard"], [1], steps=5, force=True))
    assert forced[0].skip is None and forced[0].run_id is None


def test_resume_refuses_runs_that_are_not_interrupted_and_changes_nothing(tmp_path):
    engine = get_engine(str(tmp_path / "runs.db"))
    req = planning.request(["standard"], [1, 2], steps=5)
    a, b = orchestrator.enqueue(engine, planning.plan(engine, req), req)
    states.transition(engine, a, states.FAILED, states.SUPERVISOR)
    with pytest.raises(AttnresError, match=f"run {b} is queued"):
        orchestrator.reopen(engine, [a, b])
    assert store.status_of(engine, a) == states.FAILED  # checked all before changing any
    assert orchestrator.reopen(engine, [a]) == [f"run {a} (standard, seed 1): no checkpoint: starting over from step 0"]
    assert store.status_of(engine, a) == states.QUEUED


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
