"""Machine-wide run slots: one per GPU, or one for the CPU, shared by every queue of this user on this machine.

Every queue (a foreground ``attnres launch``, a ``--detach`` queue, a ``resume``), whatever its database,
takes a run's slots with an exclusive ``flock`` on a lock file in ``paths.slots_dir()``
(``$ATTNRES_SLOTS``, else ``/tmp/attnres-slots-UID``) before it starts the run, so no two runs train at
once on one CPU or GPU. The kernel releases the locks of a process that dies, so a slot held by a dead
queue is free at once and taken over. Beside the lock, each slot file holds who took it (database,
run, pid, since) so that a queue that waits, and ``attnres status``, can say what it waits for.

Queues wait in the order they started: a queue that still has runs to start leaves a ticket in the
folder, and a slot goes to the oldest live ticket, so the queued runs of an earlier launch start
before those of a later one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from attnres import paths
from attnres.durations import duration
from attnres.logline import say


@dataclass(frozen=True)
class Holder:
    """Who holds a slot: the run a queue started on it, and since when."""

    slot: str
    db: str
    run: int
    pid: int
    since: datetime  # UTC

    def text(self, now: datetime | None = None) -> str:
        """``the cpu slot: run 7 of sqlite:////x/runs.db (pid 123) since 01:02:03 UTC, 4m10s ago``."""
        age = ((now or datetime.now(UTC)) - self.since).total_seconds()
        return (f"the {self.slot.replace('-', ' ')} slot: run {self.run} of {self.db} (pid {self.pid}) "
                f"since {self.since:%H:%M:%S} UTC, {duration(age)} ago")


def _alive(pid: int, since: float | None = None) -> bool:
    """A live process ``pid`` (started no later than ``since``: not a later process that reused the pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return since is None or proc.create_time() <= since + 5
    except psutil.Error:
        return False


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def holders(folder: Path | None = None, names: list[str] | None = None) -> list[Holder]:
    """Who holds the machine's slots now, read from the slot files (no lock taken: a read verb can call it).

    A record whose process is gone is not a holder: the kernel released its lock with the process.
    """
    folder = folder or paths.slots_dir()
    out = []
    for path in sorted(folder.glob("*")) if folder.is_dir() else []:
        if path.name.startswith("wait-") or (names is not None and path.name not in names):
            continue
        rec = _read(path)
        try:
            since = datetime.fromtimestamp(float(rec["since"]), UTC)
            holder = Holder(path.name, str(rec["db"]), int(rec["run"]), int(rec["pid"]), since)
        except (TypeError, KeyError, ValueError, OSError, OverflowError):
            continue
        if _alive(holder.pid, holder.since.timestamp()):
            out.append(holder)
    return out


class Slots:
    """The slots one queue takes and gives back, and its place in the line of waiting queues."""

    def __init__(self, gpus: list[str], db: str = "") -> None:
        self.names = [f"gpu-{g}" for g in gpus] or ["cpu"]
        self.folder = paths.slots_dir()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.db = db
        self.held: dict[str, int] = {}
        self.started = time.time()
        self.ticket = self.folder / f"wait-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def take(self, n: int, run_id: int = 0) -> list[str] | None:
        """``n`` free slots for run ``run_id``, now, or None (nothing taken): all busy, or an older queue waits."""
        self._wait_in_line()
        if self._older_waiting():
            return None
        got: list[str] = []
        for name in self.names:
            if len(got) == n:
                break
            if name in self.held:
                continue
            fd = os.open(self.folder / name, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held by another queue
                os.close(fd)
                continue
            self.held[name] = fd
            got.append(name)
        if len(got) < n:
            self.give(got)
            return None
        record = json.dumps({"db": self.db, "run": run_id, "pid": os.getpid(), "since": time.time()}).encode()
        for name in got:
            with contextlib.suppress(OSError):  # (a full disk: the lock holds all the same, unnamed)
                os.ftruncate(self.held[name], 0)
                os.pwrite(self.held[name], record, 0)
        return got

    def give(self, names: list[str]) -> None:
        for name in names:
            fd = self.held.pop(name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def busy(self) -> list[Holder]:
        """Who holds the slots this queue would take (for the line it prints while it waits)."""
        return holders(self.folder, [n for n in self.names if n not in self.held])

    def done_waiting(self) -> None:
        """This queue has no run left to start: it leaves the line."""
        self.ticket.unlink(missing_ok=True)

    def _wait_in_line(self) -> None:
        if not self.ticket.exists():
            with contextlib.suppress(OSError):
                self.ticket.write_text(json.dumps({"pid": os.getpid(), "since": self.started, "db": self.db}))

    def _older_waiting(self) -> bool:
        """Whether a live queue that started before this one still waits to start a run."""
        for path in self.folder.glob("wait-*"):
            if path == self.ticket:
                continue
            rec = _read(path)
            try:
                pid, since = int(rec["pid"]), float(rec["since"])
            except (TypeError, KeyError, ValueError):
                continue
            if not _alive(pid, since):
                path.unlink(missing_ok=True)  # a queue that died waiting: out of the line
            elif (since, path.name) < (self.started, self.ticket.name):
                return True
        return False


def waiting(folder: Path | None = None) -> list[str]:
    """What a queued run waits for, in lines `attnres status` prints: who holds the machine's run slots (a run of
    this or another database, its queue's pid, since when), or that none is held."""
    held = holders(folder)
    if not held:
        return ["queued runs start as soon as their queue takes a free run slot (none is held now)"]
    return [f"queued runs wait for a run slot; held: {h.text()}" for h in held]


class Waiting:
    """The line a queue prints when its next run cannot start: what it waits for (who holds the slot, since
    when), again when that changes and every ``EVERY_S`` while it lasts, so a wait is never silent."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        self.last: tuple | None = None
        self.at = 0.0
        self.since = 0.0

    def say(self, run_id: int, slots: Slots) -> None:
        busy = slots.busy()
        key = (run_id, tuple((h.slot, h.db, h.run, h.pid) for h in busy))
        now = time.monotonic()
        if key == self.last and now - self.at < self.EVERY_S:
            return
        if self.last is None:
            self.since = now
        self.last, self.at = key, now
        what = ("; ".join(h.text() for h in busy) if busy
                else "a queue launched earlier on this machine, whose runs start first")
        waited = f" (waiting {duration(now - self.since)})" if now - self.since >= 1 else ""
        say(f"run {run_id} is queued: it waits for {what}{waited}")

    def clear(self) -> None:
        self.last = None
