"""Backends through their protocol: a new one is one module and one registry line; the local one's checks."""

from __future__ import annotations

import contextlib
import io
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

import pytest
from helpers import in_process

from attnres.errors import AttnresError
from attnres.runs import backends, orchestrator, planning
from attnres.runs.backends import ALIVE, GONE, Backend, Placement, Submitted
from attnres.runs.backends import HEARTBEAT_SILENCE_S as STALE_AFTER_S
from attnres.runs.backends.local import LocalBackend
from attnres.tracking import states
from attnres.tracking.records import RunRecord
from attnres.tracking.run_store import RunStore


class PlainBackend(Backend):
    """A whole backend, as a user would add one: runs each trainer in this process, one by one (its own
    SIGTERM handler put back after each)."""

    name = "plain"
    killed: ClassVar[list[int]] = []

    def submit(self, store: RunStore, run_ids: Sequence[int], placement: Placement, *, detach: bool = False,
               on_tick: Callable[[], None] | None = None) -> Submitted:
        from attnres import train

        for rid in run_ids:
            handler = signal.getsignal(signal.SIGTERM)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    train.main(["--run-id", str(rid), "--db", store.url])
            finally:
                signal.signal(signal.SIGTERM, handler)
        return Submitted([f"ran {len(run_ids)} run(s) here"], {r: store.status_of(r) for r in run_ids})

    def poll(self, runs):
        return {r.id: (GONE, "plain runs never outlive submit") for r in runs}

    def kill(self, run, store=None) -> None:
        PlainBackend.killed.append(run.id)


@pytest.mark.integration
def test_a_backend_is_one_module_and_one_registry_line(workdir, monkeypatch):
    monkeypatch.setitem(backends.REGISTRY, "plain", f"{__name__}:PlainBackend")
    store = RunStore(str(workdir / "runs.db"))
    small = ["batch_size=2", "eval_batches=1", "n_layer=1", "d_model=32", "n_head=2", "seq_len=32", "vocab_size=320"]
    req = planning.request(["standard"], [1, 2], steps=2, backend="plain", overrides=small, data="builtin-bytes")
    ids, done = orchestrator.launch(store, req, planning.plan(store, req))
    assert done.results == {ids[0]: states.FINISHED, ids[1]: states.FINISHED}
    assert all(store.run(i).backend == "plain" for i in ids)
    # kill and reconcile find the backend through the run's row
    def queue(seed: int) -> list[int]:
        one = planning.request(["control_block"], [seed], steps=2, backend="plain", overrides=small,
                               data="builtin-bytes")
        return orchestrator.enqueue(store, planning.plan(store, one), one)

    again = queue(3)
    assert orchestrator.kill(store, again) == again and PlainBackend.killed == again
    late = queue(4)
    store.move(late[0], states.RUNNING, states.TRAINER)
    assert orchestrator.reconcile(store) == late
    r = store.run(late[0])
    assert (r.status, r.message) == (states.FAILED, "plain runs never outlive submit")
    # resume, dry runs and logs go through the run's backend too (its protocol's defaults here)
    done = orchestrator.resume(store, late)
    assert done.results == {late[0]: states.FINISHED}
    assert backends.get("plain").describe(7, "sqlite:///x.db", Placement(nproc=2))[0].endswith(
        "--nproc_per_node=2 --start-method fork -m attnres.train -- --run-id 7 --db sqlite:///x.db")
    with pytest.raises(AttnresError, match=f"run {late[0]}'s log .* is gone"):  # (this backend writes no log file)
        list(backends.get("plain").logs(store, store.run(late[0])))


def test_a_dry_run_shows_what_its_backend_would_run(workdir, capsys, monkeypatch):
    code, out, _ = in_process(["launch", "standard", "--seeds", "1", "--backend", "slurm", "--partition", "gpu",
                               "--time", "1:00:00", "--nodes", "2", "--dry-run"], capsys, monkeypatch)
    assert code == 0 and "#SBATCH --partition=gpu" in out and "#SBATCH --nodes=2" in out and "srun" in out
    code, out, _ = in_process(["launch", "standard", "--seeds", "1", "--dry-run"], capsys, monkeypatch)
    assert code == 0 and "-m attnres.runs.torchrun --standalone" in out and "#SBATCH" not in out


def test_an_unknown_backend_is_one_clear_line():
    with pytest.raises(AttnresError, match="unknown backend 'k8s'"):
        backends.get("k8s")


def running_row(store: RunStore, host: str, pid: int | None, beat_age_s: float, seed: int,
                started_s_ago: float = 0) -> RunRecord:
    rid = store.create_run(planning.plan(None, planning.request(["standard"], [seed]))[0].cfg)
    store.move(rid, states.RUNNING, states.TRAINER, host=host, pid=pid,
               started_at=states.now() - timedelta(seconds=started_s_ago),
               heartbeat_at=states.now() - timedelta(seconds=beat_age_s))
    return store.run(rid)


def test_local_poll_decides_by_process_on_this_host_and_by_heartbeat_elsewhere(tmp_path):
    import socket

    store = RunStore(str(tmp_path / "runs.db"))
    here = socket.gethostname()
    cases = {
        "alive here, silent": (running_row(store, here, os.getpid(), STALE_AFTER_S * 10, 1), ALIVE),
        "gone here, fresh": (running_row(store, here, 2**31 - 1, 0, 2), GONE),  # no such pid, ever
        # a run from a day ago whose pid now belongs to a process that began since (this one): reused
        "reused pid here": (running_row(store, here, os.getpid(), 0, 5, started_s_ago=86400), GONE),
        "elsewhere, silent": (running_row(store, "another-host", 12345, STALE_AFTER_S * 2, 3), GONE),
        "elsewhere, fresh": (running_row(store, "another-host", 12345, 1, 4), ALIVE),
    }
    got = LocalBackend().poll([run for run, _ in cases.values()])
    assert {name: got[run.id][0] for name, (run, _) in cases.items()} == {n: v for n, (_, v) in cases.items()}


def test_a_resumed_run_takes_its_last_attempts_spool_along_and_the_old_queue_leaves_it_be(tmp_path, monkeypatch):
    """A trainer killed with values only in its spool, then resumed while its old queue is still settling:
    the spool is recorded as the last attempt's at the reopening, and the old queue records nothing after it
    (its late replay once gave the new attempt the dead pid and start time, and a monitor failed the run)."""
    import json
    import socket

    from attnres.runs.backends.local import settle

    store = RunStore(str(tmp_path / "runs.db"))
    killed = running_row(store, socket.gethostname(), 2**31 - 1, 0, 6)
    store.update_run(killed.id, agent_pid=2**31 - 2, log_path=str(tmp_path / "run.log"))
    path = tmp_path / "run.spool.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [
        {"run": killed.id, "fields": {"status": states.RUNNING, "pid": 2**31 - 1}},
        *({"r": killed.id, "s": s, "m": {"train_loss": 1.0 / s}} for s in (1, 2, 3)),
        {"run": killed.id, "fields": {"step": 3}}]))
    assert store.move(killed.id, states.KILLED, states.USER)
    import torch

    from attnres import paths
    from attnres.training import checkpoint

    monkeypatch.setenv("ATTNRES_CHECKPOINTS", str(tmp_path / "checkpoints"))
    model = torch.nn.Linear(2, 2)
    checkpoint.save(paths.checkpoints_dir(killed.id), model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    assert orchestrator.reopen(store, [killed.id]) == [
        f"run {killed.id} (standard, seed {killed.seed}): from step 3 of {killed.total_steps} (its last checkpoint)"]
    r = store.run(killed.id)
    assert (r.status, r.agent_pid, r.step) == (states.QUEUED, None, 3) and path.stat().st_size == 0
    assert sorted(store.metrics_frame(["train_loss"], [killed.id])["step"]) == [1, 2, 3]
    assert settle(store, killed.id, -9, tmp_path / "run.log", pid=2**31 - 2) == states.QUEUED  # the old queue
    assert store.run(killed.id).message is None


def test_the_monitor_judges_a_run_only_while_nobody_else_changes_it(tmp_path):
    import socket


    store = RunStore(str(tmp_path / "runs.db"))
    rid = running_row(store, socket.gethostname(), 2**31 - 1, 0, 7).id  # its process is gone
    store.update_run(rid, log_path=str(tmp_path / "run.log"))
    seen = store.run(rid)
    with store.hold(seen):  # a relaunch or the run's queue is at it
        assert LocalBackend().reconcile(store, [seen]) == []
    store.update_run(seen.id, pid=os.getpid())  # a new attempt started since the look
    assert LocalBackend().reconcile(store, [seen]) == [] and store.status_of(seen.id) == states.RUNNING
    store.update_run(seen.id, pid=seen.pid)
    assert LocalBackend().reconcile(store, [seen]) == [seen.id] and store.status_of(seen.id) == states.FAILED


def test_a_file_system_without_flock_leaves_the_spool_unserialised_not_stuck(tmp_path, monkeypatch):
    """NFS mounted nolock (ENOLCK) or Lustre without flock (ENOSYS): runs go on as before the lock existed."""
    import errno
    import fcntl

    from attnres.tracking import spool

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    for wait in (True, False):
        with spool.held(tmp_path / "run.spool.jsonl", wait=wait) as ours:
            assert ours


@dataclass(frozen=True)
class HeldOptions:
    """A user backend's own typed options."""

    nodes: int = 1
    partition: str | None = None


class HeldBackend(Backend):
    """A backend that only records what it was asked to run, and how it was to place it."""

    name = "held"
    Options = HeldOptions
    placed: ClassVar[list[tuple[list[int], Placement]]] = []

    def submit(self, store: RunStore, run_ids: Sequence[int], placement: Placement, *, detach: bool = False,
               on_tick: Callable[[], None] | None = None) -> Submitted:
        HeldBackend.placed.append((list(run_ids), placement))
        return Submitted([f"held {len(run_ids)} run(s)"])

    def poll(self, runs):
        return {r.id: (ALIVE, "") for r in runs}

    def kill(self, run) -> None:
        pass


def test_a_resumed_run_is_placed_as_its_launch_placed_it(tmp_path, monkeypatch):
    monkeypatch.setitem(backends.REGISTRY, "held", f"{__name__}:HeldBackend")
    monkeypatch.setenv("ATTNRES_CHECKPOINTS", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("ATTNRES_LOGS", str(tmp_path / "logs"))
    store = RunStore(str(tmp_path / "runs.db"))
    where = backends.get("held").placement(2, {"nodes": "3", "partition": "gpu"})
    assert where == Placement(2, HeldOptions(nodes=3, partition="gpu"))
    req = planning.request(["standard"], [1, 2], steps=5, backend="held", placement=where)
    ids = orchestrator.enqueue(store, planning.plan(store, req), req)
    assert all(backends.get("held").placement_of(store.run(rid)) == where for rid in ids)
    for rid in ids:
        store.move(rid, states.FAILED, states.SUPERVISOR)
    store.update_run(ids[1], placement_json=None)  # (recorded before placements were: its rank count)
    HeldBackend.placed.clear()
    orchestrator.resume(store, ids)
    assert HeldBackend.placed == [([ids[0]], where), ([ids[1]], Placement(2, HeldOptions()))]
