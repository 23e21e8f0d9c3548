"""Rank 0's bookkeeping of a tracked run: metrics, heartbeat, early-stop rule and the run's states.

Everything goes through the run's :class:`attnres.tracking.writer.MetricWriter`, so the training
thread never waits on the database and nothing is lost when it is away: the run's row (its
snapshot) and each change are in the spool first.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from attnres.conditions import merged, with_load
from attnres.errors import AttnresError
from attnres.logline import say
from attnres.on_end import wait as wait_for_on_end
from attnres.tracking import DatabaseError, states
from attnres.tracking.run_store import RunStore
from attnres.training.loop import Ending

if TYPE_CHECKING:
    from attnres.tracking import MetricWriter

HEARTBEAT_S = 5.0


class NotStarted(AttnresError):
    """The run ended (a user killed it, most often) between its queue starting the trainer and the trainer
    marking it running: there is nothing to train, and nothing went wrong."""

    def __init__(self, run_id: int, state: str | None) -> None:
        self.run_id, self.state = run_id, state
        how = "killed" if state == states.KILLED else f"already {state}"
        super().__init__(f"run {run_id} was {how} before its trainer started; nothing to do")


def _machine_busy() -> float:
    """Core-seconds every CPU of the machine has been busy (idle and I/O wait left out; guests are in user)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - sum(getattr(t, f, 0.0) for f in ("iowait", "guest", "guest_nice"))


def _own_busy(with_siblings: bool = False) -> float:
    """Core-seconds this process (its threads; not its children) has used, with its sibling ranks' if asked."""
    me = psutil.Process()
    procs = [me] + ([p for p in (me.parent().children() if me.parent() else []) if p.pid != me.pid]
                    if with_siblings else [])
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # (a sibling that ended)
            continue
    return total


class LoadSampler:
    """Other processes' mean share of the machine's CPU (0..1) between the first and the last :meth:`sample`:
    the machine's busy core-seconds less this process's (and, under DDP, its sibling ranks'), over the wall
    time times the machine's cores. The heartbeat samples it; a run records it with its conditions."""

    def __init__(self, machine: Callable[[], float] = _machine_busy, own: Callable[[], float] = _own_busy,
                 cores: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.machine, self.own, self.clock = machine, own, clock
        self.cores = cores or psutil.cpu_count() or 1
        self.lock = threading.Lock()
        self.others = self.seconds = 0.0
        self.last: tuple[float, float, float] | None = None

    def sample(self) -> None:
        try:
            now = (self.clock(), self.machine(), self.own())
        except (psutil.Error, OSError):
            return
        with self.lock:
            if self.last is not None and now[0] <= self.last[0]:
                return  # (a sample read before the last one was taken: the reference never moves back)
            if self.last is not None:
                self.seconds += now[0] - self.last[0]
                self.others += max(0.0, (now[1] - self.last[1]) - (now[2] - self.last[2]))
            self.last = now

    def share(self) -> float | None:
        """The mean share so far; None before two samples."""
        with self.lock:
            return min(1.0, self.others / (self.seconds * self.cores)) if self.seconds > 0 else None


class Heartbeat(threading.Thread):
    """Refresh the run's heartbeat every few seconds, so a dead run is noticed even between logs; and sample
    the load other processes put on the machine meanwhile (``load``)."""

    def __init__(self, writer: MetricWriter, every: float = HEARTBEAT_S, load: LoadSampler | None = None) -> None:
        super().__init__(daemon=True, name="attnres-heartbeat")
        self.writer, self.every = writer, every
        self.stopped = threading.Event()
        self.load = load or LoadSampler()
        self.load.sample()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.load.sample()
            self.writer.update_run(heartbeat_at=states.now())


class RunRecorder:
    """The :class:`attnres.training.loop.Recorder` of rank 0 for a run recorded in the database."""

    def __init__(self, store: RunStore, run_id: int, world_size: int = 1, device: str | None = None,
                 conditions: dict[str, object] | None = None) -> None:
        self.store, self.run_id, self.conditions = store, run_id, conditions
        run = store.run(run_id)
        self.conditions_json = merged(run.conditions_json, conditions, run.step > 0) if conditions else None
        self.rule = json.loads(run.rule_json) if run.rule_json else None
        self.scope = {"experiment": run.experiment, "preset": run.preset, "total_steps": run.total_steps}
        specs = json.loads(run.mirrors_json) if run.mirrors_json else []
        sender = None
        if specs:
            from attnres.mirrors.sender import Sender

            sender = Sender(store, run_id, specs)
        self.writer = store.writer(run, mirror=sender)
        # values an earlier attempt recorded: a restart from step 0 (no checkpoint) replaces them once it trains
        self.stale = bool(store.latest_values([run_id], ["train_loss", "eval_loss"]).get(run_id))
        # what an earlier attempt could not write, under the spool lock: no monitor judges the run before we start
        with store.recover(run):
            self.writer.keep_snapshot(store.run_fields(run_id))  # should the database be lost
            self.writer.transition(states.RUNNING, started_at=states.now(), heartbeat_at=states.now(),
                                   pid=os.getpid(), host=socket.gethostname(), world_size=world_size, device=device,
                                   **({"conditions_json": self.conditions_json} if conditions else {}))
            started = self.writer.flush()
        if started and self.writer.refused:  # killed (or ended) before it could start: do not train
            was = self.writer.refused[0][1]
            self.writer.close()
            raise NotStarted(run_id, was)
        self.heartbeat = Heartbeat(self.writer, load=LoadSampler(own=functools.partial(_own_busy, world_size > 1)))
        self.heartbeat.start()

    # -- the loop's Recorder protocol -------------------------------------------------------------
    def resumed(self, step: int) -> None:
        if step or self.stale:  # before the values this attempt writes again
            self.writer.drop_after(step if step else -1)
            if not step:
                self.writer.update_run(step=0)

    def record(self, step: int, **values: float) -> None:
        self.writer.add_values(step, values)  # (the dict this call's keywords made: one copy fewer a step)

    def progress(self, step: int) -> None:
        self.writer.progress(step)  # (the heartbeat thread keeps heartbeat_at fresh, every few seconds)

    def verdict(self, step: int, eval_loss: float) -> str | None:
        """The early-stop rule: worse than the baseline's mean eval loss (same experiment, preset and budget,
        and in a sweep the same cell) by more than ``by``."""
        r = self.rule
        if r is None or step != r["at_step"]:
            return None
        try:
            base = self.store.eval_at_step(r["baseline"], step=step, exclude=self.run_id,
                                           settings=r.get("settings"), **self.scope)
        except DatabaseError:
            return None  # the database is away: no verdict, training goes on
        if base is None or eval_loss <= base + r["by"]:
            return None
        return (f"eval loss {eval_loss:.3f} is worse than {r['baseline']}'s {base:.3f} by more than {r['by']} "
                f"at step {step}")

    # -- the end ------------------------------------------------------------------------------------
    def finish(self, ending: Ending) -> bool:
        """Record how the loop ended; True if the database holds everything."""
        fields: dict[str, object] = {"ended_at": states.now(), "exit_code": 0, "step": ending.step}
        if ending.status in (states.DIVERGED, states.STOPPED):
            fields |= {"stop_step": ending.step, "message": ending.message}
        elif ending.status == states.PREEMPTED:
            fields |= {"ended_at": None, "message": ending.message}
        return self._end(ending.status, fields)

    def fail(self, exc: BaseException) -> bool:
        """Record that training raised ``exc``."""
        return self._end(states.FAILED, {"ended_at": states.now(), "exit_code": 1,
                                          "message": f"{type(exc).__name__}: {exc}"[:2000]})

    def _end(self, status: str, fields: dict[str, object]) -> bool:
        self.heartbeat.stopped.set()
        load = self.heartbeat.load
        load.sample()
        if self.conditions and self.conditions_json and (share := load.share()) is not None:  # the load it had
            fields = fields | {"conditions_json": with_load(self.conditions_json, self.conditions, share,
                                                                  load.seconds)}
        self.writer.transition(status, **fields)
        ok = self.writer.close()
        wait_for_on_end()  # the --on-end command the recorded end started (the trainer leaves without teardown)
        for asked, was in self.writer.refused:
            say(f"attnres: run {self.run_id} was already {was}: its change to {asked} is not recorded")
        if not ok:
            if self.writer.unkept():  # (the writer named what and which steps) only what came before is kept
                say(f"attnres: run {self.run_id}: the database cannot be written and {self.writer.lost_values()} "
                    f"value(s) are lost; what came before them is in the database and {self.writer.spool} "
                    "(`attnres sync` writes the spool's part once the database can be written); its end is not "
                    "recorded")
            else:
                say(f"attnres: the database cannot be written; run {self.run_id}'s metrics and state are in "
                    f"{self.writer.spool}: `attnres sync` writes them once it is back")
        return ok


def open_recorder(store: RunStore, run_id: int, world_size: int, device: str | None = None,
                  conditions: dict[str, object] | None = None) -> RunRecorder:
    """Rank 0's recorder; a database that cannot be read at start is one clear error."""
    try:
        return RunRecorder(store, run_id, world_size, device, conditions)
    except DatabaseError as exc:
        raise AttnresError(f"cannot record run {run_id}: {str(exc).splitlines()[0]}") from None
