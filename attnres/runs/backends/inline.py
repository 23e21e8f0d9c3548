"""The inline backend: each run trained in this very process, one after another, without torchrun.

    attnres launch standard --backend inline --steps 50

What a researcher reaches for to step into a run with a debugger (``python -m pdb -m attnres.cli.main launch ...``),
to profile one (``py-spy record -- attnres launch ... --backend inline``), or to train from a notebook: one
rank, on this process's device (its first visible GPU, else the CPU), with no torchrun agent and no trainer
interpreter to start (on a small CPU that is 5-6 s of imports a run, more than a short run's training). The
trainer is the same code (:func:`attnres.train.main`), at the compute threads the local queue would give it, so a
run records the same losses, steps and conditions as on the local backend; its peak memory is this process's
during the run (reset before each on Linux), which includes the launcher's own resident memory.

It behaves as the local backend's foreground queue does, in the ways a user relies on: it takes the machine's
slot before each run (so it never trains beside a queue), the run's output goes to the run's log, Ctrl-C
stops the run at the end of its step with a checkpoint (preempted; a second Ctrl-C stops at once) and leaves
the runs not started preempted, and `attnres kill RUN` from another terminal stops the run it trains (SIGTERM:
checkpoint, then killed) while this process goes on with its next run; a SIGTERM between runs stops the launch
before its next run. It cannot ``--detach`` (the local backend's queue does that) and trains one rank
(``--nproc 1``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from attnres import paths
from attnres.errors import AttnresError
from attnres.runs.backends import NoOptions, Placement, QueueStopped, Submitted
from attnres.runs.backends.devices import threads_per_process, visible_gpus
from attnres.runs.backends.local import LocalBackend, claim, settle
from attnres.runs.backends.processes import kill_grace_s, process_alive
from attnres.runs.backends.slots import Slots, Waiting, holders
from attnres.tracking import states
from attnres.tracking.run_store import RunRecord, RunStore
from attnres.training.loop import Preemption, started_as


class InlineBackend(LocalBackend):
    """Runs on this machine, in the process that submits them (see the module's docstring)."""

    name = "inline"
    Options = NoOptions

    def check(self, placement: Placement) -> None:
        if placement.nproc != 1:
            raise AttnresError(f"--nproc {placement.nproc}: the inline backend trains one rank, in this process "
                               "(the local backend starts several through torchrun)")

    def check_detach(self, detach: bool) -> None:
        if detach:
            raise AttnresError("--detach: the inline backend trains in this process, so it cannot return before "
                               "its runs end (the local backend's queue runs in the background)")

    def ranks(self, placement: Placement) -> int:
        return 1

    def warning(self, placement: Placement) -> str | None:
        return None

    def describe(self, run_id: int | str, db_url: str, placement: Placement) -> list[str]:
        return [f"in this process: attnres.train.main(['--run-id', '{run_id}', '--db', {db_url!r}])"]

    def submit(self, store: RunStore, run_ids: Sequence[int], placement: Placement, *,
               detach: bool = False, on_tick: Callable[[], None] | None = None) -> Submitted:
        self.check_detach(detach)
        return Submitted(results=train_here(store, run_ids, on_tick))

    def kill(self, run: RunRecord, store: RunStore | None = None) -> None:
        """SIGTERM to the process that trains the run (its trainer saves a checkpoint at the end of its step and
        records its end; the process then goes on with its next run), SIGKILL to that process alone when the run
        is still recorded running after ``kill_grace_s()``. Nothing is signalled unless the run is recorded
        running and its process holds the machine's slot for this run (a launcher that went on to another run,
        or a run queued again since, is not stopped), or when this very process trains it."""
        pid = run.pid if run.host == socket.gethostname() and run.status == states.RUNNING else None
        if not pid or pid == os.getpid() or not process_alive(pid, run.started_at) or not _trains(pid, run.id):
            return
        for sig in (signal.SIGTERM, signal.SIGCONT):  # (a stopped process handles the SIGTERM once it runs)
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        end = time.monotonic() + kill_grace_s()
        while process_alive(pid) and time.monotonic() < end:
            if store is not None and store.status_of(run.id) != states.RUNNING:
                return  # the trainer recorded its end: the process is free for its next run
            time.sleep(0.05)
        if process_alive(pid) and (store is None or store.status_of(run.id) == states.RUNNING):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _trains(pid: int, run_id: int) -> bool:
    """Whether process ``pid`` trains run ``run_id`` as far as the machine's slots say: it holds a slot for that
    run, or holds none on record (a slot file a full disk left unnamed)."""
    theirs = [h for h in holders() if h.pid == pid]
    return not theirs or any(h.run == run_id for h in theirs)


class _Launch:
    """The launching process's signals while it trains runs: Ctrl-C stops the launch (the run being trained
    checkpoints first; a second Ctrl-C stops at once), SIGTERM between runs stops it before the next one (in a
    run, the trainer's own handler stops that run alone: `attnres kill`)."""

    def __init__(self) -> None:
        self.stop = False
        self.run: Preemption | None = None
        self.terminal = sys.stderr  # (before a run's output is sent to its log)

    def on_int(self, _signum: int, _frame: object) -> None:
        if self.stop:
            raise KeyboardInterrupt
        self.stop = True
        if self.run is not None:
            self.run.requested = True
        with contextlib.suppress(OSError, ValueError):
            print("attnres: stopping at the end of this step (a checkpoint first); Ctrl-C again stops at once",
                  file=self.terminal, flush=True)

    def on_term(self, _signum: int, _frame: object) -> None:
        self.stop = True


@contextlib.contextmanager
def _signals() -> Iterator[_Launch]:
    """:class:`_Launch`'s handlers while the block runs, this process's own put back after (one it ignores, or one
    set from C, is left as it is)."""
    launch = _Launch()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    mine = {signal.SIGINT: launch.on_int, signal.SIGTERM: launch.on_term}
    installed = []
    try:
        for sig, handler in mine.items():
            if before[sig] not in (signal.SIG_IGN, None):
                signal.signal(sig, handler)
                installed.append(sig)
    except ValueError:  # not the main thread (a notebook's worker): no signal handling
        pass
    try:
        yield launch
    finally:
        for sig in installed:
            signal.signal(sig, before[sig])


def train_here(store: RunStore, run_ids: Sequence[int], on_tick: Callable[[], None] | None = None) -> dict[int, str]:
    """Train the queued runs in this process, one by one, each when the machine's slot is free; returns
    {run_id: end state}. Stopped (Ctrl-C, SIGTERM between runs), the run being trained checkpoints and ends
    preempted, the runs not started become preempted, and :class:`QueueStopped` is raised; an error leaves no run
    queued behind it."""
    slots = Slots(visible_gpus()[:1], store.url)  # (this process trains on its first GPU: that slot)
    claim(store, run_ids)
    pending, results, waiting = list(run_ids), {}, Waiting()
    with _signals() as launch:
        try:
            while pending and not launch.stop:
                rid = pending[0]
                if (status := store.status_of(rid)) != states.QUEUED:  # killed (or started elsewhere) meanwhile
                    results[pending.pop(0)] = status
                    continue
                taken = slots.take(1, rid)
                if taken is None:
                    waiting.say(rid, slots)
                    if on_tick:
                        on_tick()
                    time.sleep(0.5)
                    continue
                try:
                    waiting.clear()
                    pending.pop(0)
                    if not pending:
                        slots.done_waiting()
                    code, log = _one(store, rid, launch)
                finally:
                    slots.give(taken)
                results[rid] = settle(store, rid, code, log, owner={"queue_pid": os.getpid()})
                if on_tick:
                    on_tick()
        except KeyboardInterrupt:  # (a second Ctrl-C while waiting for the slot)
            launch.stop = True
        except BaseException:
            with contextlib.suppress(Exception):
                _set_aside(store, pending, results)
            raise
        finally:
            slots.done_waiting()
    if launch.stop:
        _set_aside(store, pending, results)
        raise QueueStopped(results)
    return results


def _set_aside(store: RunStore, pending: Sequence[int], results: dict[int, str]) -> None:
    for rid in pending:
        store.move(rid, states.PREEMPTED, states.SUPERVISOR,
                   message="not started: its launch was stopped; `attnres resume` or a relaunch starts it")
        results[rid] = store.status_of(rid)


def _one(store: RunStore, run_id: int, launch: _Launch) -> tuple[int, Path]:
    """Train one run here as a queue's process would: its own peak memory and compute threads, SIGTERM stopping
    it with a checkpoint from its first moment; its exit code as a process's, and its log."""
    import torch

    from attnres import train

    run = store.run(run_id)
    log = Path(run.log_path) if run.log_path else paths.run_log(run_id)
    with contextlib.suppress(OSError):  # this run's peak resident set, not the process's so far (Linux)
        Path("/proc/self/clear_refs").write_text("5")
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 0) or threads_per_process(1))
    between = signal.getsignal(signal.SIGTERM)  # (the launch's own, or the process's where it left SIGTERM alone)
    launch.run = Preemption()  # (installs the trainer's SIGTERM handler now, not once its loop begins)
    started_as("inline")
    try:
        return _trainer(train.main, ["--run-id", str(run_id), "--db", store.url], log, launch.run), log
    finally:
        launch.run = None
        if between is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, between)
        torch.set_num_threads(threads)
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # the next queue's run gets this GPU whole
            torch.cuda.empty_cache()
        if "torch._dynamo" in sys.modules:  # (a compiled run's graphs and recompile counts are its own)
            sys.modules["torch._dynamo"].reset()


def _trainer(main: Callable[..., int], argv: list[str], log: Path, preemption: Preemption) -> int:
    """Run the trainer's ``main`` here, its output appended to the run's log (as a queue's torchrun writes it);
    its exit code as a process would have it (1 for an error, whose traceback goes to the log)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", buffering=1, errors="replace") as fh, contextlib.redirect_stdout(fh), \
            contextlib.redirect_stderr(fh):
        try:
            return main(argv, preemption)
        except KeyboardInterrupt:  # a second Ctrl-C: stopped at once (the trainer recorded it)
            return -signal.SIGINT
        except Exception:  # noqa: BLE001 (the trainer recorded the failure; the queue goes on with its next run)
            traceback.print_exc()
            return 1
