"""The inline backend: each run trained in this very process, one after another, without torchrun.

    attnres launch standard --backend inline --steps 50

What a researcher reaches for to step into a run with a debugger (``python -m pdb -m cli.main launch ...``),
to profile one (``py-spy record -- attnres launch ... --backend inline``), or to train from a notebook: one
rank, on this process's device (its first visible GPU, else the CPU), with no torchrun agent and no trainer
interpreter to start (on a small CPU that is 5-6 s of imports a run, more than a short run's training). What a
run records is the same as on the local backend: the trainer is the same code (:func:`attnres.train.main`).

It behaves as the local backend's foreground queue does, in the ways a user relies on: it takes the machine's
slot before each run (so it never trains beside a queue), the run's output goes to the run's log, Ctrl-C
stops the run at the end of its step with a checkpoint (preempted; a second Ctrl-C stops at once) and leaves
the runs not started preempted, and `attnres kill RUN` from another terminal stops the run it trains (SIGTERM:
checkpoint, then killed) while this process goes on with its next run. It cannot ``--detach`` (the local
backend's queue does that) and trains one rank (``--nproc 1``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from attnres import paths
from attnres.errors import AttnresError
from attnres.logline import say
from attnres.runs.backends import NoOptions, Placement, QueueStopped, Submitted
from attnres.runs.backends.devices import visible_gpus
from attnres.runs.backends.local import LocalBackend, Waiting, claim, settle
from attnres.runs.backends.processes import kill_grace_s, kill_tree, process_alive
from attnres.runs.backends.slots import Slots
from attnres.tracking import states
from attnres.tracking.run_store import RunRecord, RunStore


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
        records its end; the process then goes on with its next run), SIGKILL only when the run is still
        recorded running after ``kill_grace_s()``. A run trained by this very process is not signalled."""
        pid = run.pid if run.host == socket.gethostname() else None
        if not pid or pid == os.getpid() or not process_alive(pid, run.started_at):
            return
        for sig in (signal.SIGTERM, signal.SIGCONT):  # (a stopped process handles the SIGTERM once it runs)
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        end = time.monotonic() + kill_grace_s()
        while process_alive(pid) and time.monotonic() < end:
            if store is not None and store.run(run.id).pid == pid and store.status_of(run.id) != states.RUNNING:
                return  # the trainer recorded its end: the process is free for its next run
            time.sleep(0.05)
        if store is None or store.status_of(run.id) == states.RUNNING:
            kill_tree(None, pid)


class Terminated(Exception):
    """SIGTERM reached the process before the trainer's loop took it over (as a trainer process would die of it)."""


def train_here(store: RunStore, run_ids: Sequence[int], on_tick: Callable[[], None] | None = None) -> dict[int, str]:
    """Train the queued runs in this process, one by one, each when the machine's slot is free; returns
    {run_id: end state}. Ctrl-C: the run being trained checkpoints and ends preempted, the runs not started
    become preempted, and :class:`QueueStopped` is raised."""
    from attnres import train

    gpus = visible_gpus()[:1]  # (this process trains on its first GPU: the slot it takes is that one)
    slots = Slots(gpus, store.url)
    claim(store, run_ids)
    pending, results, waiting = list(run_ids), {}, Waiting()
    stopping = False
    try:
        while pending:
            rid = pending[0]
            if store.status_of(rid) != states.QUEUED:  # killed (or started elsewhere) while waiting
                results[pending.pop(0)] = store.status_of(rid)
                continue
            taken = slots.take(1, rid)
            if taken is None:
                waiting.say(rid, slots)
                if on_tick:
                    on_tick()
                time.sleep(0.5)
                continue
            waiting.clear()
            pending.pop(0)
            if not pending:
                slots.done_waiting()
            run = store.run(rid)
            log = Path(run.log_path) if run.log_path else paths.run_log(rid)
            try:
                with _stop_on_ctrl_c() as asked:
                    code = _trainer(train.main, ["--run-id", str(rid), "--db", store.url], log)
                stopping = asked()
            finally:
                slots.give(taken)
            results[rid] = settle(store, rid, code, log)
            if on_tick:
                on_tick()
            if stopping:
                break
    except KeyboardInterrupt:  # Ctrl-C while waiting for the slot
        stopping = True
    finally:
        slots.done_waiting()
    if stopping:
        for rid in pending:
            store.move(rid, states.PREEMPTED, states.SUPERVISOR,
                       message="not started: its launch was stopped; `attnres resume` or a relaunch starts it")
            results[rid] = store.status_of(rid)
        raise QueueStopped(results)
    return results


def _trainer(main: Callable[[list[str]], int], argv: list[str], log: Path) -> int:
    """Run the trainer's ``main`` here, its output appended to the run's log (as a queue's torchrun writes it);
    its exit code as a process would have it (1 for an error, whose traceback goes to the log)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", buffering=1, errors="replace") as fh, contextlib.redirect_stdout(fh), \
            contextlib.redirect_stderr(fh):
        try:
            return main(argv)
        except Terminated:  # SIGTERM (`attnres kill`) before the trainer's loop began
            return -signal.SIGTERM
        except KeyboardInterrupt:  # a second Ctrl-C
            return -signal.SIGINT
        except Exception:  # noqa: BLE001 (the trainer recorded the failure; the queue goes on with its next run)
            traceback.print_exc()
            return 1


@contextlib.contextmanager
def _stop_on_ctrl_c() -> Iterator[Callable[[], bool]]:
    """While a run trains: Ctrl-C asks the trainer to stop at the end of its step (the SIGTERM its torchrun would
    pass on), a second one stops at once; the handlers this process had are put back after."""
    asked = [False]
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_int(_signum: int, _frame: object) -> None:
        if asked[0]:
            raise KeyboardInterrupt
        asked[0] = True
        say("attnres: stopping at the end of this step (a checkpoint first); Ctrl-C again stops at once", err=True)
        signal.raise_signal(signal.SIGTERM)  # the trainer's preemption handler, once its loop runs

    def on_term(_signum: int, _frame: object) -> None:  # before the trainer's loop took SIGTERM over
        raise Terminated

    try:
        signal.signal(signal.SIGINT, on_int)
        signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: no signal handling (a notebook's worker thread)
        yield lambda: asked[0]
        return
    try:
        yield lambda: asked[0]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
