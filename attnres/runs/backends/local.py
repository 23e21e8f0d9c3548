"""The local backend: a queue that runs queued runs on this machine's free GPUs, or one at a time on CPU.

Each run gets its own torchrun process in a new process session (so a kill can end the whole group),
``CUDA_VISIBLE_DEVICES`` for the GPUs assigned to it, and its own log file. When a process ends, the queue (the
run's supervisor) settles the run: it ingests what the trainer could not write, and a run whose trainer recorded no
end is failed with its exit code and last log lines. ``attnres launch --detach`` starts the queue in the background
(``python -m attnres.runs.backends.local --db URL --runs 3 4 5``): it outlives the terminal.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil

from attnres import paths
from attnres.errors import AttnresError
from attnres.logline import say
from attnres.runs.backends import (
    ALIVE,
    GONE,
    UNKNOWN,
    Backend,
    Placement,
    QueueStopped,
    Submitted,
    log_tail,
    silence,
    trainer_command,
)
from attnres.runs.backends.devices import gpu_driver_loaded, threads_per_process, visible_gpus
from attnres.runs.backends.processes import detached, kill_grace_s, kill_tree, process_alive
from attnres.runs.backends.slots import Slots, Waiting, waiting
from attnres.tracking import DatabaseError, states
from attnres.tracking.run_store import RunRecord, RunStore


@dataclass
class Job:
    """A run's torchrun process, its log, the machine slots it holds and a descriptor of its exit."""

    proc: subprocess.Popen
    log: Path
    slots: list[str] = field(default_factory=list)
    exit_fd: int | None = field(default=None, init=False)  # readable once the process has exited (a pidfd)

    def __post_init__(self) -> None:
        try:
            self.exit_fd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: the queue notices the exit at its next poll
            pass

    def close(self) -> None:
        if self.exit_fd is not None:
            os.close(self.exit_fd)
            self.exit_fd = None


def nap(jobs: Sequence[Job], seconds: float) -> None:
    """Wait ``seconds``, or less: until one of the jobs' processes exits.

    The queue settles a run, starts the next one and lets a killer's wait end as soon as a trainer
    leaves, not at its next poll (half a second, for each of the suite's ~50 runs and every kill).
    """
    fds = [job.exit_fd for job in jobs if job.exit_fd is not None]
    if fds:
        select.select(fds, [], [], seconds)
    else:
        time.sleep(seconds)


def start(store: RunStore, db_url: str, run_id: int, nproc: int, slots: list[str]) -> Job:
    """Start one run's torchrun in its own session, output appended to the run's log."""
    run = store.run(run_id)
    log = Path(run.log_path) if run.log_path else paths.run_log(run_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    gpus = [s.removeprefix("gpu-") for s in slots if s.startswith("gpu-")]
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    # compute threads per process to fit the cores (one set by the user is kept): the trainer records
    # the number, as its tokens/s depends on it (attnres.tracking.speed)
    env.setdefault("OMP_NUM_THREADS", str(threads_per_process(len(gpus), max(1, len(visible_gpus()) // len(gpus)))
                                          if gpus else threads_per_process(nproc)))
    with log.open("ab") as fh:
        proc = subprocess.Popen(trainer_command(run_id, db_url, nproc), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    store.update_run(run_id, agent_pid=proc.pid)
    return Job(proc, log, slots)


def settle(store: RunStore, run_id: int, returncode: int, log: Path, pid: int | None = None,
           owner: dict[str, object] | None = None) -> str:
    """Record the end of a run whose process ``pid`` exited; returns its final status.

    A run re-queued meanwhile (a relaunch or resume) belongs to its new process: left alone (its row no longer
    holds ``owner``'s values, by default ``agent_pid=pid``). A
    database that is gone or unusable is not written (the run's spool keeps its last word for
    ``attnres sync``): the queue goes on, and the state it returns says the end is not recorded.
    """
    how = (f"killed by signal {-returncode} ({signal.Signals(-returncode).name})" if returncode < 0
           and -returncode in signal.Signals._value2member_map_ else f"exited with code {returncode}")
    try:
        store.check_location()
        run = store.run(run_id)
        ours = owner or ({"agent_pid": pid} if pid is not None else None)  # still this attempt's run

        def still_ours() -> bool:  # a run re-queued meanwhile is its new process's, and so is its spool
            now = store.run(run_id)
            return all(getattr(now, col) == value for col, value in (ours or {}).items())

        # the run's own last word, if it could not reach the database; a relaunch cannot reopen the run
        # between the check and the end below
        with store.recover(run, only_if=still_ours, keep_going=True) as recovered:
            if not recovered.read:
                return store.run(run_id).status
            if recovered.error is not None:
                say(f"attnres: run {run_id}: {recovered.error}", err=True)
            if store.move(run_id, states.FAILED, states.SUPERVISOR, where=ours, ended_at=states.now(),
                          exit_code=returncode, message=f"process {how} without recording an end\n{log_tail(log)}"):
                return states.FAILED
            run = store.run(run_id)
            if run.exit_code is None or (returncode != 0 and run.exit_code == 0):
                store.update_run(run_id, where=ours, exit_code=returncode)
            if run.status == states.FINISHED:  # a finished run is a complete run: else incomplete, holes named
                store.check_complete([{"id": run.id, "status": run.status, "total_steps": run.total_steps,
                                       "config_json": run.config_json}], states.SUPERVISOR)
            return store.status_of(run_id)
    except (DatabaseError, OSError, AttnresError) as exc:
        say(f"attnres: cannot record how run {run_id} ended ({str(exc).splitlines()[0][:200]}): the database may "
            "still say it runs; its log says what its trainer kept and where, and `attnres sync` records the end "
            "once the database can be written", err=True)
        return f"process {how}; its end is not recorded (the database cannot be written)"


def run_queue(store: RunStore, run_ids: Sequence[int], nproc: int = 1, gpus_per_run: int = 1,
              on_tick: Callable[[], None] | None = None, poll: float = 0.5) -> dict[int, str]:
    """Run the given queued runs to completion, each when its slots are free; returns {run_id: end state}.

    Interrupted (Ctrl-C, or SIGTERM to a detached queue), it stops its runs with a checkpoint
    (preempted), marks those not started preempted too, and raises :class:`QueueStopped`.
    """
    url = store.url
    gpus = visible_gpus()
    per_run = gpus_per_run if gpus else 1
    if gpus and per_run > len(gpus):
        raise AttnresError(f"--gpus-per-run {per_run} but this machine has {len(gpus)} GPU(s)")
    slots = Slots(gpus, url)
    claim(store, run_ids)
    pending, active, results = deque(run_ids), {}, {}
    waiting = Waiting()
    try:
        while pending or active:
            while pending:
                status = store.status_of(pending[0])
                if status != states.QUEUED:  # killed (or started elsewhere) while waiting
                    results[pending.popleft()] = status
                    continue
                taken = slots.take(per_run, pending[0])
                if taken is None:  # every slot is busy, here or in another queue on this machine
                    if not active:
                        waiting.say(pending[0], slots)
                    break
                waiting.clear()
                rid = pending.popleft()
                active[rid] = start(store, url, rid, per_run if gpus else nproc, taken)
            if not pending:
                slots.done_waiting()
            for rid, job in list(active.items()):
                if job.proc.poll() is not None:
                    results[rid] = settle(store, rid, job.proc.returncode, job.log, job.proc.pid)
                    slots.give(job.slots)
                    job.close()
                    del active[rid]
            if on_tick:
                on_tick()
            if pending or active:
                nap(list(active.values()), poll)
    except KeyboardInterrupt:
        raise _stop(store, active, pending, slots, results) from None
    finally:
        slots.done_waiting()
    return results


def claim(store: RunStore, run_ids: Sequence[int]) -> None:
    """Record this process as the queue of its queued runs (host, pid, start time), so that a monitor can tell
    when it died with runs still waiting (:meth:`LocalBackend.reconcile`)."""
    since = datetime.fromtimestamp(psutil.Process().create_time(), UTC).replace(tzinfo=None)
    for rid in run_ids:
        store.update_run(rid, where={"status": states.QUEUED}, queue_host=socket.gethostname(),
                         queue_pid=os.getpid(), queue_since=since)


GRACE_S = 120  # how long a stopped run may take to write its checkpoint before it is killed


def _stop(store: RunStore, active: dict[int, Job], pending: deque[int], slots: Slots,
          results: dict[int, str]) -> QueueStopped:
    """Stop the queue: running runs checkpoint and end preempted; runs not started become preempted."""
    for job in active.values():
        try:
            os.kill(job.proc.pid, signal.SIGTERM)  # torchrun passes it to its workers: checkpoint, then stop
        except ProcessLookupError:
            pass
    end = time.monotonic() + GRACE_S
    try:
        while any(job.proc.poll() is None for job in active.values()) and time.monotonic() < end:
            nap([job for job in active.values() if job.proc.poll() is None], 0.2)
    except KeyboardInterrupt:  # asked twice: do not wait for checkpoints
        pass
    for rid, job in active.items():
        if job.proc.poll() is None:
            kill_tree(job.proc.pid, store.run(rid).pid)
            job.proc.wait()
        results[rid] = settle(store, rid, job.proc.returncode, job.log, job.proc.pid)
        slots.give(job.slots)
        job.close()
    for rid in pending:
        store.move(rid, states.PREEMPTED, states.SUPERVISOR,
                       message="not started: its queue was stopped; `attnres resume` or a relaunch starts it")
        results[rid] = store.status_of(rid)
    return QueueStopped(results)


def start_detached(db_url: str, run_ids: Sequence[int], nproc: int, gpus_per_run: int) -> int:
    """Start the queue in the background (new session, output to a log); return its pid."""
    cmd = [sys.executable, "-m", "attnres.runs.backends.local", "--db", db_url, "--nproc", str(nproc),
           "--gpus-per-run", str(gpus_per_run), "--runs", *map(str, run_ids)]
    return detached(cmd, paths.queue_log(run_ids[0]))



@dataclass(frozen=True)
class LocalOptions:
    """What a run on this machine asks for beyond its ranks."""

    gpus_per_run: int = 1  # GPUs each run gets when the machine has GPUs (--gpus-per-run)


class LocalBackend(Backend):
    """Runs on this machine, through the queue above."""

    name = "local"
    Options = LocalOptions

    def check(self, placement: Placement) -> None:
        if placement.nproc < 1 or placement.option("gpus_per_run", 1) < 1:
            raise AttnresError("--nproc and --gpus-per-run must be at least 1")

    def ranks(self, placement: Placement) -> int:
        """``--gpus-per-run`` ranks on a machine with GPUs (one per GPU), else ``--nproc`` on the CPU."""
        return placement.option("gpus_per_run", 1) if visible_gpus() else placement.nproc

    def warning(self, placement: Placement) -> str | None:
        """What ``--gpus-per-run`` will not do on a machine without GPUs: each run then trains on CPU (``--nproc``
        processes), which a user who asked for GPUs should hear before the runs start, not find out from their
        speed. None when it is honoured (or not asked: one GPU per run is the default). torch is asked for its GPU
        count only when a GPU driver is loaded and several GPUs per run are asked for."""
        gpus = placement.option("gpus_per_run", 1)
        if gpus <= 1 or (gpu_driver_loaded() and visible_gpus()):
            return None  # (fewer GPUs than asked for: the queue refuses that itself)
        return (f"--gpus-per-run {gpus}: this machine has no GPU, so each run trains on CPU "
                f"with {placement.nproc} process(es) (--nproc)")

    def submit(self, store: RunStore, run_ids: Sequence[int], placement: Placement, *,
               detach: bool = False, on_tick: Callable[[], None] | None = None) -> Submitted:
        if detach:
            pid = start_detached(store.url, run_ids, placement.nproc, placement.option("gpus_per_run", 1))
            return Submitted([f"queued runs {', '.join(map(str, run_ids))}; queue running in the background "
                              f"(pid {pid}); follow with `attnres status --watch` or `attnres logs RUN -f`"])
        results = run_queue(store, run_ids, placement.nproc, placement.option("gpus_per_run", 1),
                            on_tick=on_tick)
        return Submitted(results=results)

    def poll(self, runs: Sequence[RunRecord]) -> dict[int, tuple[str, str]]:
        """A run on this host is alive while its trainer (or torchrun) process is (the process that
        started before the run did, not a later one that reused its pid); on another host while its
        heartbeat is fresh. Heartbeat age alone never condemns a run on this host: a database locked
        for a while stops heartbeats, not training."""
        host, out = socket.gethostname(), {}
        for run in runs:
            if run.status != states.RUNNING:
                out[run.id] = (UNKNOWN, "")
            elif run.host == host and (run.pid or run.agent_pid):
                alive = any(process_alive(p, since=run.started_at) for p in (run.pid, run.agent_pid) if p)
                out[run.id] = (ALIVE, "") if alive else (
                    GONE, f"process {run.pid} on {run.host} is gone without recording an end\n{log_tail(run.log_path)}")
            else:
                why = silence(run)
                out[run.id] = (GONE, why) if why else (ALIVE, "")
        return out

    @staticmethod
    def _orphaned(run: RunRecord) -> str | None:
        """Why a queued run will never start (its queue died on this host: a SIGKILL, a power cut), or None."""
        if (run.status != states.QUEUED or not run.queue_pid or run.queue_host != socket.gethostname()
                or process_alive(run.queue_pid, since=run.queue_since)):
            return None
        return f"not started: its queue (pid {run.queue_pid}) is gone; `attnres resume {run.id}` (or the same " \
               "launch again) starts it"

    def waits(self, runs: Sequence[RunRecord]) -> list[str]:
        """Who holds the machine's run slots (:func:`~attnres.runs.backends.slots.waiting`), for queued runs whose
        queue still lives."""
        return waiting() if any(not self._orphaned(r) for r in runs) else []

    def unrecorded(self, runs: Sequence[RunRecord]) -> dict[int, tuple[str, str]]:
        """As every backend's, and a queued run whose queue is gone would be preempted."""
        return super().unrecorded(runs) | {r.id: (states.PREEMPTED, w) for r in runs if (w := self._orphaned(r))}

    def reconcile(self, store: RunStore, runs: Sequence[RunRecord], errors: list[str] | None = None) -> list[int]:
        """As every backend's, and a queued run whose queue is gone is preempted (`attnres resume` and a relaunch
        continue it), instead of waiting forever for a queue that will never start it."""
        dead = super().reconcile(store, runs, errors)
        for run, why in [(r, w) for r in runs if (w := self._orphaned(r))]:  # (one look at each queue)
            if self.tried(errors, store.move, run.id, states.PREEMPTED, states.MONITOR, message=why,
                          where={"queue_pid": run.queue_pid, "status": states.QUEUED}):
                dead.append(run.id)
        return dead

    def kill(self, run: RunRecord, store: RunStore | None = None) -> None:
        """SIGTERM first (torchrun passes it to the trainer, which saves a checkpoint at the end of its step,
        so `attnres resume` continues from there), SIGKILL for whatever is left after ``kill_grace_s()``."""
        trainer = run.pid if run.host == socket.gethostname() and run.status == states.RUNNING else None
        procs = [p for p in (run.agent_pid, trainer) if p and p != os.getpid() and process_alive(p, run.started_at)]
        # torchrun if it is there (it stops its workers), else the trainer itself; then SIGCONT to each: a stopped
        # process (SIGSTOP, ^Z) handles the SIGTERM once it runs again
        for pid, sig in [*((p, signal.SIGTERM) for p in procs[:1]), *((p, signal.SIGCONT) for p in procs)]:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        end = time.monotonic() + kill_grace_s()
        while any(process_alive(p) for p in procs) and time.monotonic() < end:
            time.sleep(0.05)
        kill_tree(run.agent_pid, trainer)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="attnres.runs.backends.local", description="run queued attnres runs")
    p.add_argument("--db", required=True)
    p.add_argument("--runs", type=int, nargs="+", required=True)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--gpus-per-run", type=int, default=1)
    args = p.parse_args(argv)
    store = RunStore(args.db)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a detached queue stops as on Ctrl-C
    try:
        results = run_queue(store, args.runs, args.nproc, args.gpus_per_run)
    except QueueStopped as stop:
        say(str(stop))
        return 130
    for rid, status in results.items():
        say(f"run {rid}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
