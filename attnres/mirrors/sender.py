"""Sending one run to its mirrors: as it trains (a thread fed by the metric writer) or later (``sync``).

The training thread never sees a mirror. The metric writer hands each batch it wrote to the
database to a :class:`Sender`, whose own thread sends it on, so neither training nor our database
waits on a tracker. Each mirror is sent only what is past its marks (:mod:`attnres.tracking.mirror_marks`),
and the marks move once the mirror took a batch: a resumed run, a second sender or ``attnres sync
--mirror`` sends nothing twice. A mirror that cannot be used (its package missing, its server
away, an error) costs one warning line; it is left out for the rest of the run, and what it did not
get is sent later by ``attnres sync --mirror SPEC``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attnres import depth_keys, mirrors
from attnres.config import flatten
from attnres.logline import say
from attnres.tracking import DatabaseError, held, states

if TYPE_CHECKING:
    from attnres.tracking.run_store import RunRecord, RunStore

Rows = list[tuple[int, dict[str, float]]]
CHUNK = 1000  # steps a sync sends per call of a mirror (MLflow's log_batch takes 1,000 values a call)
LOCK_WAIT_S = 30.0  # how long a trainer's sender waits for another sender of its run to finish
SKIPPED = "skipped"  # a sync's result for a run another process is sending
ENDS = (*states.ENDED, states.PREEMPTED)  # the states a mirror's run is ended with (a preempted one may resume)


def run_info(store: RunStore, run: RunRecord) -> mirrors.RunInfo:
    """How a run is named and described in a mirror (its config as params, its place as tags)."""
    try:
        config = json.loads(run.config_json or "{}")
    except ValueError:
        config = {}
    db = store.database_id()
    tags = {"attnres.run_id": str(run.id), "attnres.variant": run.variant, "attnres.seed": str(run.seed),
            "attnres.preset": run.preset, "attnres.experiment": run.experiment or run.preset,
            "attnres.config_hash": run.config_hash, "attnres.database": db}
    return mirrors.RunInfo(run_id=run.id, identity=f"{run.id}-{db}", name=f"{run.variant} s{run.seed} #{run.id}",
                           experiment=run.experiment or run.preset, tags=tags,
                           params={k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(config).items()})


def _after(rows: Iterable[tuple[int, dict[str, float]]], marks: dict[str, int]) -> Rows:
    """The values past the marks (a resumed attempt's re-trained steps were sent by the first one), without the
    depth-attention maps (hundreds of keys an eval, kept in their own table: a tracker gets the metrics)."""
    out = []
    for step, values in rows:
        fresh = {k: v for k, v in values.items() if step > marks.get(k, -1) and not k.startswith(depth_keys.PREFIX)}
        if fresh:
            out.append((step, fresh))
    return out


class Link:
    """One run's connection to one mirror: opened once, then sent what is past its marks.

    The marks move once the tracker holds the points: for MLflow when ``log`` returns; for a tracker
    that buffers (trackio, W&B) one batch later, and all of them once ``end`` flushed it. A sender
    killed in between leaves at most its last batch unmarked, which the next sender sends again: a
    point may then reach a buffering tracker twice, but is never lost.
    """

    def __init__(self, store: RunStore, run: RunRecord, spec: str) -> None:
        self.store, self.run_id, self.spec = store, run.id, spec
        self.mirror = mirrors.make(mirrors.parse(spec))
        self.marks = store.mirror_marks(run.id, spec)
        self.mirror.open(run_info(store, run))
        self.unsaved: dict[str, int] = {}  # marks the tracker holds, not yet in the database
        self.lagging: dict[str, int] = {}  # a buffering tracker's last batch: held once the next is sent

    def send(self, rows: Iterable[tuple[int, dict[str, float]]]) -> int:
        """Send what is past the marks; returns the values sent."""
        fresh = _after(rows, self.marks)
        if not fresh:
            return 0
        self.mirror.log(fresh)
        reached: dict[str, int] = {}
        for step, values in fresh:
            for key in values:
                self.marks[key] = reached[key] = step
        if self.mirror.buffered:
            self.unsaved.update(self.lagging)
            self.lagging = reached
        else:
            self.unsaved.update(reached)
        self.save()
        return sum(len(v) for _, v in fresh)

    def end(self, status: str) -> None:
        """Mark the remote run ended (its tracker flushes), then every mark sent."""
        self.mirror.end(status)
        self.unsaved.update(self.lagging)
        self.lagging = {}
        self.save()

    def save(self) -> None:
        """Record the marks (kept and retried with the next batch if the database is away now)."""
        try:
            self.store.save_mirror_marks(self.run_id, self.spec, self.unsaved)
            self.unsaved = {}
        except DatabaseError:
            pass


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def _warn(run_id: int, spec: str, exc: BaseException) -> None:
    say(f"attnres: warning: mirror {spec} left out for run {run_id} ({_first_line(exc)}); training and the "
        f"database go on; `attnres sync --mirror {spec}` sends what it missed", err=True)


def lock_path(run: RunRecord) -> Path:
    """The lock whoever sends a run to its mirrors holds (``<spool>.mirror.lock``): one sender at a time."""
    return Path(f"{run.spool}.mirror")


class Sender:
    """The background sender of one training run to its mirrors (fed by the metric writer)."""

    def __init__(self, store: RunStore, run_id: int, specs: Sequence[str]) -> None:
        self.store, self.run_id, self.specs = store, run_id, list(specs)
        self.inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self.links: list[Link] = []
        self.caught_up = False
        self.thread = threading.Thread(target=self._loop, name="attnres-mirror", daemon=True)
        self.thread.start()

    def send(self, rows: Rows) -> None:
        """Rows the database now holds (called by the writer's thread; returns at once)."""
        if rows:
            self.inbox.put(("rows", rows))

    def catch_up(self) -> None:
        """The database took rows some other way (a spool replayed after it was away): send them from there."""
        self.inbox.put(("catch up", None))

    def status(self, to: str) -> None:
        """The run moved to ``to`` (an end is passed on to the mirrors, which then finish their run)."""
        self.inbox.put(("status", to))

    def close(self, timeout: float = 120.0) -> bool:
        """Send what is queued and finish; False (with one line) if the mirrors were still busy at ``timeout``."""
        self.inbox.put(("close", None))
        self.thread.join(timeout)
        if self.thread.is_alive():
            say(f"attnres: warning: mirrors still sending run {self.run_id} after {timeout:g} s; left to "
                f"`attnres sync --mirror`", err=True)
            return False
        return True

    def _each(self, action: Callable[[Link], object]) -> None:
        for link in list(self.links):
            try:
                action(link)
            except DatabaseError:  # our database, away for a moment: the points stay past the marks for later
                self.caught_up = False
            except Exception as exc:  # noqa: BLE001 - a tracker's failure of any kind must not reach training
                _warn(self.run_id, link.spec, exc)
                self.links.remove(link)

    def _catch_up(self) -> None:
        """Send what the database holds past the marks (what earlier attempts missed, a replayed spool).

        Not before the writer's first batch of the attempt: a resumed attempt's stale steps are dropped
        from the database before its first batch, and must not be sent first.
        """
        self.caught_up = True
        self._each(lambda link: link.send(self.store.unsent(self.run_id, link.marks)))

    def _loop(self) -> None:
        try:
            run = self.store.mirrored_runs([self.run_id])[0]
        except Exception as exc:  # noqa: BLE001
            for spec in self.specs:
                _warn(self.run_id, spec, exc)
            return self._drain()
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            with held(lock_path(run), wait=False) as free:  # one sender of a run at a time
                if free:
                    return self._serve(run)
            if time.monotonic() >= deadline:  # (not an `attnres sync --mirror` finishing: a process still sending)
                for spec in self.specs:
                    _warn(self.run_id, spec, RuntimeError(f"another process sends this run ({lock_path(run)}.lock)"))
                return self._drain()
            time.sleep(0.5)

    def _serve(self, run: RunRecord) -> None:
        for spec in self.specs:
            try:
                self.links.append(Link(self.store, run, spec))
            except Exception as exc:  # noqa: BLE001 - missing package, unreachable server, bad URI: one warning
                _warn(self.run_id, spec, exc)
        while True:
            kind, item = self.inbox.get()
            ending = kind == "status" and item in ENDS
            if kind == "catch up":  # (sent when the writer recovers, maybe before a resume's drop: sent later)
                self.caught_up = False
                continue
            if (kind in ("rows", "close") or ending) and not self.caught_up:
                self._catch_up()
            if kind == "close":
                return
            if kind == "rows" and self.caught_up:  # (else they are in the database: the next catch-up sends them)
                self._each(lambda link, rows=item: link.send(rows))
            elif ending:
                self._each(lambda link, to=item: link.end(str(to)))

    def _drain(self) -> None:
        while self.inbox.get()[0] != "close":
            pass


def sync(store: RunStore, specs: Sequence[str], run_ids: Sequence[int] | None = None,
         on_run: Callable[[int, str, int], None] | None = None) -> list[tuple[int, str, int | str]]:
    """Send runs (``run_ids``, or every run) to mirrors: what each mirror does not hold yet, then the run's state
    (a queued or running run is left to its trainer when the trainer sends it to that mirror itself).

    Returns (run, mirror spec, values sent or the error's first line); ``on_run(run, spec, sent)`` is
    called as each is done (progress).
    """
    targets = mirrors.specs(list(specs))
    done: list[tuple[int, str, int | str]] = []
    for run in store.mirrored_runs(run_ids):
        with held(lock_path(run), wait=False) as free:
            if not free:  # its trainer is sending it now (or another sync): two senders would race over the marks
                done += [(run.id, spec, f"{SKIPPED}: another process is sending this run now") for spec in targets]
                continue
            for spec in targets:
                try:
                    link = Link(store, run, spec)
                    rows = store.unsent(run.id, link.marks)
                    sent = sum(link.send(rows[i:i + CHUNK]) for i in range(0, len(rows), CHUNK))
                    if run.status in ENDS:
                        link.end(run.status)
                    result: int | str = sent
                except mirrors.MirrorUnavailable:
                    raise
                except Exception as exc:  # noqa: BLE001 - reported per run; the others are still sent
                    result = _first_line(exc)
                done.append((run.id, spec, result))
                if on_run is not None:
                    on_run(run.id, spec, result if isinstance(result, int) else -1)
    return done
