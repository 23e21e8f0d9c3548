"""A run's spool: the append-only JSONL write-ahead log of its metric writer, and its one reader.

The trainer's writer appends every value and every change of its run to the spool before the
database sees it, so whatever the database misses (locked, unreachable, read-only, deleted) is
still on disk. :func:`ingest` is the only code that reads a spool back into the database; the
writer (retrying, and when it closes), the queue (when a trainer exits), a status check (before it
calls a vanished run failed) and ``attnres sync`` all call it.

Lines, one JSON object each::

    {"r": RUN, "s": STEP, "m": {KEY: VALUE, ...}}   the metric values of one step (one ``add``)
    {"r": RUN, "s": STEP, "k": KEY, "v": VALUE}     one metric value (spools before 2026-12)
    {"run": RUN, "fields": {...}}                    bookkeeping columns (step, heartbeat, ...)
    {"run": RUN, "fields": {"status": S, ...}}       the trainer moved its run to S (states.TRAINER)
    {"run": RUN, "snapshot": {...}}                  the whole run row: recreates a lost run
    {"run": RUN, "drop_after": STEP}                 a resumed attempt: values past STEP are stale

Metric rows are unique per (run, key, step), so ingesting a spool twice records each value once;
state changes go through :func:`attnres.tracking.states.transition`, so replaying an old
"running" can never reopen a run that has ended since.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

from sqlalchemy import Engine

from attnres.errors import AttnresError
from attnres.tracking import confirm, run_rows, states
from attnres.tracking.db import check_location

BATCH = 5000
# json.dumps builds an encoder per call; the training thread encodes a line per logged step, so one is kept.
# (NaN and inf are written as JSON's usual extensions, and read back alike.)
_encode = json.JSONEncoder(ensure_ascii=True).encode


def _refuse(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _values_encoder() -> Callable[[dict[str, float]], str]:
    """json's own C encoder, made once: ``JSONEncoder.encode`` makes one per call, half of its cost
    (4.5 of 2.2 µs for a step's five values, measured). Same text; the plain encoder where json has no C part."""
    from json.encoder import c_make_encoder, encode_basestring_ascii

    try:
        make = c_make_encoder(None, _refuse, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    except TypeError:  # no C accelerator (None), or another signature: the usual way
        return _encode
    return lambda values: "".join(make(values, 0))


_encode_values = _values_encoder()


def line_makers(run_id: int) -> tuple[Callable[[int, dict[str, float]], str], Callable[[int], str]]:
    """The two lines the training thread writes every logged step, for one run: its metric values
    (``metrics(step, values)``) and its newest step (``step(step)``), the run's part formatted once."""
    metrics_head, step_head = f'{{"r": {int(run_id)}, "s": ', f'{{"run": {int(run_id)}, "fields": {{"step": '
    encode = _encode_values
    return (lambda step, values: f'{metrics_head}{int(step)}, "m": {encode(values)}}}\n',
            lambda step: f"{step_head}{int(step)}}}}}\n")


def fields_line(run_id: int, fields: dict[str, object]) -> str:
    return f'{{"run": {int(run_id)}, "fields": {_encode(_jsonable(fields))}}}\n'


def snapshot_line(run_id: int, row: dict[str, object]) -> str:
    return json.dumps({"run": run_id, "snapshot": _jsonable(row)}) + "\n"


def drop_line(run_id: int, step: int) -> str:
    return json.dumps({"run": run_id, "drop_after": step}) + "\n"


def _jsonable(fields: dict[str, object]) -> dict[str, object]:
    return {k: (v.isoformat() if isinstance(v, datetime | date) else v) for k, v in fields.items()}


@dataclass
class _RunLog:
    """What a spool says of one run, in order."""

    updates: list[dict[str, object]] = field(default_factory=list)
    snapshot: dict[str, object] | None = None
    metrics: list[tuple[int, str, float]] = field(default_factory=list)
    drop_after: int | None = None  # the earliest resume point: the database's values past it are stale


def rejects_of(spool: Path) -> Path:
    """Where unreadable lines of a spool are kept aside (never dropped)."""
    return Path(spool).with_name(Path(spool).name + ".rejects")


SUFFIX = ".spool.jsonl"  # how a spool's name ends (:func:`attnres.paths.spool_of`)
_HEADS = (b'{"r": ', b'{"run": ')  # how every line a writer writes begins
LOOK_LINES, LOOK_BYTES = 8, 1 << 20  # what :func:`identify` reads of a file: its first lines, within its first MiB
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


def identify(path: Path) -> Path:
    """``path`` if it is a run's spool (a link: the spool it points to, whose lock the other processes take); else
    AttnresError, one line. Reads at most its first MiB; creates, changes and truncates nothing.

    ``attnres sync FILE`` empties each spool it has written into the database, so a file that is not one (a
    text file, the password file, a directory, a FIFO, a device) must be refused before anything is touched. A
    spool is a regular file whose first lines (up to :data:`LOOK_LINES`) hold a spool record and nothing foreign:
    each is a record, a line cut short by a crash or a full disk (the start of a line of ours), bytes that are
    not text (garbled, or the zeros a power cut leaves) or blank; the first may also be any text that is not
    JSON (the end of a record whose start was lost, garbled). An empty file is a spool by its name alone
    (``*.spool.jsonl``: an ingested spool is kept empty), as is one whose only lines are cut lines of ours. The
    file is opened only once it is known to be regular (opening a FIFO waits for a writer; opening a device may
    act), and without waiting.
    """
    path = Path(path)
    shown = f"{path} (a link to {os.path.realpath(path)})" if path.is_symlink() else str(path)
    refused = f"nothing was changed (`attnres sync` reads spool files, logs/run-N{SUFFIX})"
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise AttnresError(f"{shown} is {_KINDS.get(stat.S_IFMT(mode), 'not a regular file')}, "
                               f"not a run's spool: {refused}")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # (replaced since the look)
                raise AttnresError(f"{shown} is not a regular file, not a run's spool: {refused}")
            head = b""
            while len(head) < LOOK_BYTES and (got := os.read(fd, LOOK_BYTES - len(head))):
                head += got
        finally:
            os.close(fd)
    except OSError as exc:
        raise AttnresError(f"cannot read {shown} ({exc.strerror or exc}): {refused}") from None
    ours_by_name = path.resolve().name.endswith(SUFFIX)
    if not head:
        if ours_by_name:
            return path.resolve() if path.is_symlink() else path
        raise AttnresError(f"{shown} is empty and not named like a spool (*{SUFFIX}): not a run's spool: {refused}")
    lines = head.split(b"\n")
    if lines[-1] == b"" or len(head) == LOOK_BYTES:  # (a line the MiB cut is not looked at)
        lines.pop()
    kinds = [_line_kind(raw, first=i == 0) for i, raw in enumerate(lines[:LOOK_LINES])]
    if "foreign" in kinds:
        raise AttnresError(f"{shown} is not a run's spool: its line {kinds.index('foreign') + 1} is not a spool "
                           f"record: {refused}")
    if "record" not in kinds and not ("cut" in kinds and ours_by_name):
        which = (f"its first {len(kinds)} lines" if len(lines) > len(kinds) else f"its {len(kinds)} line(s)") if kinds \
            else "its first MiB (no whole line)"
        raise AttnresError(f"{shown} is not a run's spool: no spool record in {which}: {refused}")
    return path.resolve() if path.is_symlink() else path


def _line_kind(raw: bytes, first: bool) -> str:
    """What one line of a file is, to :func:`identify`: record, cut (of ours), noise (blank, garbled) or foreign."""
    line = raw.lstrip(b"\0")  # (a power cut may leave zeros where a line was to be)
    if not line.strip():
        return "noise"
    try:
        obj = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return "noise"  # not text: garbled
    except (ValueError, RecursionError):  # text, not JSON: a line of ours cut short at either end, or foreign
        if any(line.startswith(head) or head.startswith(line) for head in _HEADS):
            return "cut"
        if first:  # (the end of a line whose start was lost, or garbled: what follows decides)
            return "noise"
        return "noise" if any(c < 0x20 and c not in b"\t\r" for c in line) else "foreign"
    try:
        _take({}, obj)
        return "record"
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return "cut" if isinstance(obj, dict) and ("r" in obj or "run" in obj) else "foreign"


@contextmanager
def held(spool: Path, wait: bool = True) -> Iterator[bool]:
    """Hold a run's spool against the other processes that read it back and then change the run.

    The queue that saw a trainer exit, a monitor that found it gone, a launcher reopening the run and
    the next trainer starting each read the spool, then change the run. Interleaved, the last
    attempt's lines could land on the next attempt (its pid and start time replayed over the new
    ones, and the run then called dead). An flock on ``<spool>.lock`` serialises them; the trainer's
    own appends need no lock. Yields whether to go on: False only when ``wait`` is off and another
    process holds it. Where the lock file cannot be made (a full or read-only disk) or its file system
    has no flock, True, unserialised.
    """
    try:
        fh = Path(f"{spool}.lock").open("ab")
    except OSError:
        yield True
        return
    with fh:  # the lock goes with the file's closing
        try:
            fcntl.flock(fh, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError:  # a file system without flock (NFS mounted nolock, some Lustre): unserialised, as before
            yield True
            return
        yield True


def read(spool: Path) -> tuple[dict[int, _RunLog], list[bytes]]:
    """Parse a spool: per-run logs, and the lines that could not be read (skipped, kept for rejects)."""
    with Path(spool).open("rb") as fh:
        return _parse(fh)


def value_keys(text: str) -> set[tuple[int, str]]:
    """The (step, key) of every metric value in spool lines ``text`` (unreadable lines are skipped)."""
    runs, _ = _parse(text.encode().splitlines(keepends=True))
    return {(step, key) for log in runs.values() for step, key, _ in log.metrics}


def _parse(lines: Iterable[bytes]) -> tuple[dict[int, _RunLog], list[bytes]]:
    """Spool lines as per-run logs, and the lines that could not be read."""
    runs: dict[int, _RunLog] = {}
    bad: list[bytes] = []
    for raw in lines:
        try:
            _take(runs, json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, OverflowError,
                RecursionError):  # (RecursionError: a line of nested brackets)
            bad.append(raw)  # cut short by a crash, or garbled: its value was never acknowledged
    return runs, bad


def _take(runs: dict[int, _RunLog], obj: dict) -> None:
    if "r" in obj:
        step, log = int(obj["s"]), runs.setdefault(int(obj["r"]), _RunLog())
        if "m" in obj:
            rows = [(step, str(k), float(v)) for k, v in obj["m"].items()]  # all read before any is taken
            log.metrics.extend(rows)
        else:
            log.metrics.append((step, str(obj["k"]), float(obj["v"])))
        return
    log = runs.setdefault(int(obj["run"]), _RunLog())
    if "drop_after" in obj:  # what this spool holds past the step belongs to the attempt before
        step = int(obj["drop_after"])
        log.metrics = [m for m in log.metrics if m[0] <= step]
        log.drop_after = step if log.drop_after is None else min(log.drop_after, step)
        return
    row = dict(obj["snapshot"] if "snapshot" in obj else obj["fields"])
    if "snapshot" in obj or "config_json" in row:  # (spools before 2026-12 kept the row as a fields line)
        log.snapshot = {**(log.snapshot or {}), **row}
        return
    if "status" in row and row["status"] not in states.TRANSITIONS[states.TRAINER]:
        raise ValueError(f"a trainer never sets status {row['status']!r}")
    log.updates.append(row)


def ingest(engine: Engine, spool: Path, truncate: bool = True,
           move: Callable[..., states.Outcome] = states.transition) -> dict[str, int]:
    """Write a spool's metrics and run changes into the database (idempotent); empty it after.

    The spool is emptied only once the database at the configured location is confirmed to hold
    what it wrote (else AttnresError, and the spool is kept); unreadable lines are skipped and, when
    the spool is emptied, kept aside in ``<spool>.rejects``. Returns counts: ``rows`` (metric values
    given), ``runs`` (runs recreated from a snapshot), ``skipped`` (unreadable lines), ``refused``
    (state changes refused because the run had ended otherwise meanwhile). Each spooled state change is recorded
    through ``move`` (:func:`attnres.tracking.lifecycle.recover` passes :func:`attnres.tracking.lifecycle.move`,
    the one place that starts a run's ``--on-end`` when a change is its end).
    """
    spool = Path(spool)
    if not (spool.exists() and spool.stat().st_size):  # (nothing to write: the database is not even looked at)
        return {"rows": 0, "runs": 0, "skipped": 0, "refused": 0}
    try:
        check_location(engine)
    except OSError as exc:
        raise AttnresError(f"{exc}: {spool} is kept; `attnres sync --db ...` writes it into another database") from None
    runs, bad = read(spool)
    created = refused = 0
    for run_id, log in runs.items():
        _same_run(engine, run_id, log, spool)
        if run_rows.status_of(engine, run_id) is None:
            if log.snapshot is None:
                if log.metrics or log.updates:
                    raise AttnresError(f"spool {spool} holds run {run_id}, which this database lacks, "
                                       "and no snapshot of it")
                continue
            _restore(engine, run_id, log)
            created += 1
        else:
            refused += _replay(engine, run_id, log.updates, move)
        if log.drop_after is not None:
            run_rows.drop_metrics_after(engine, run_id, log.drop_after)
    rows = 0
    for run_id, log in runs.items():
        for start in range(0, len(log.metrics), BATCH):
            rows += run_rows.log_metrics(engine, run_id, log.metrics[start:start + BATCH])
    if truncate:
        last = {r: (log.metrics[-1][1], log.metrics[-1][0]) if log.metrics else (None, None)
                for r, log in runs.items()}  # (key, step) of each run's last value
        if not confirm.confirmed(engine, [(r, key, step) for r, (key, step) in last.items()]):
            raise AttnresError(f"the database at {engine.url.render_as_string()} does not hold what {spool} wrote "
                               "(was it deleted or replaced?): the spool is kept; `attnres sync --db ...` writes it")
        if bad:
            with rejects_of(spool).open("ab") as fh:
                fh.writelines(line if line.endswith(b"\n") else line + b"\n" for line in bad)
        os.truncate(spool, 0)
    return {"rows": rows, "runs": created, "skipped": len(bad), "refused": refused}


def _same_run(engine: Engine, run_id: int, log: _RunLog, spool: Path) -> None:
    """A spool's run must be the database's run of that id (not another database's run N)."""
    want = (log.snapshot or {}).get("config_hash")
    if want is None:
        return
    have = run_rows.config_hash_of(engine, run_id)
    if have is not None and have != want:
        raise AttnresError(f"{spool} is of another run {run_id} (config {want}) than this database's run {run_id} "
                           f"({have}): sync it into the database it came from, with --db")


def _restore(engine: Engine, run_id: int, log: _RunLog) -> None:
    """Recreate a run whose row the database lost: its snapshot, then every change after it."""
    row = dict(log.snapshot or {})
    for update in log.updates:
        row.update(update)
    row = run_rows.parse_times(row)
    row.pop("id", None)
    if not row.get("experiment"):  # a snapshot from before experiments: its preset's, as the migration does
        row["experiment"] = row.get("preset", "")
    states.create(engine, states.RESTORER, str(row.pop("status")), id=run_id, **row)


def _replay(engine: Engine, run_id: int, updates: list[dict[str, object]],
            move: Callable[..., states.Outcome] = states.transition) -> int:
    """Apply a run's spooled changes in order: columns as they come, states through the machine.

    A state change refused (the run ended otherwise meanwhile) is dropped with the columns that
    came with it; returns how many were refused.
    """
    pending: dict[str, object] = {}
    refused = 0
    for update in updates:
        update = run_rows.parse_times(update)
        if "status" not in update:
            pending.update(update)
            continue
        run_rows.update_run(engine, run_id, **pending)
        pending = {}
        to = str(update.pop("status"))
        outcome = move(engine, run_id, to, states.TRAINER, **update)
        refused += not outcome and outcome.status != to
    run_rows.update_run(engine, run_id, **pending)
    return refused
