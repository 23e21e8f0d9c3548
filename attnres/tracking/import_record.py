"""Recording an import (``attnres import``): its stages, runs, metric points and depth maps, in one transaction.

A run recorded elsewhere arrives with its end decided (``finished 3999/3999``). Written in parts, an
import killed halfway would leave such a run with some of its rows, or none, and nothing would say
so; here everything a file adds commits together or not at all. The points the database holds
already are read first: one with the same value is not written again (a file imported twice adds
nothing), one with another value refuses the whole file (:class:`Conflict`) before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, delete, insert, select
from sqlalchemy.exc import IntegrityError

from attnres import depth_keys
from attnres.errors import AttnresError
from attnres.tracking import depth_rows, records, run_rows, states
from attnres.tracking.schema import DepthWeight, Launch, Metric, MetricKey, MetricSummary, Run


@dataclass
class Incoming:
    """One run of an import file: how a stored run is recognised, the row to create when none is, its points."""

    ident: str  # its config hash: the run's identity (label, variant, seed and the scope the file gives it)
    legacy: str  # the hash imports gave before the scope was part of the identity (label, variant, seed only)
    scope: dict[str, object]  # experiment, preset, total_steps (None: any): what a run under ``legacy`` must match
    status: str
    columns: dict[str, object]  # the new run's row, for states.create (the launch id is added here)
    stage: object  # its launch value (None: the file's one stage)
    rows: list[tuple[int, int, str, float]] = field(default_factory=list)  # (file row, step, key, value)


@dataclass
class Recorded:
    """What an import did: runs created, points written, points the database held already (same value)."""

    created: int = 0
    stored: int = 0
    known: int = 0


class Conflict(Exception):
    """A point of the file that the database holds with another value (nothing was written)."""

    def __init__(self, row: int, step: int, key: str, value: float, stored: float, run_id: int) -> None:
        super().__init__(f"row {row}: {key} at step {step} is {value}, stored {stored} (run {run_id})")
        self.row, self.step, self.key, self.value, self.stored, self.run_id = row, step, key, value, stored, run_id


class _Within:
    """The engine :func:`attnres.tracking.states.create` writes a run row through (it alone writes a status),
    bound to the import's open transaction: its ``begin()`` hands over that connection, so the row commits, or
    rolls back, with the run's points."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.dialect = conn.dialect

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        yield self._conn


def record(engine: Engine, incoming: Sequence[Incoming], stage_order: Callable[[object], object]) -> Recorded:
    """Write the runs of a file in one transaction; :class:`Conflict` (nothing written) for a point stored with
    another value. ``stage_order`` sorts the launch values of the runs created (their stages, in order)."""
    done, written = Recorded(), []
    try:
        with engine.begin() as conn:
            found = _stored_runs(conn, incoming)
            fresh: list[list[tuple[int, str, float]]] = []
            for inc, run_id in zip(incoming, found, strict=True):  # every check before the first write
                new, known = _new_points(conn, inc, run_id)
                fresh.append(new)
                done.known += known
            order = sorted({inc.stage for inc, run_id in zip(incoming, found, strict=True) if run_id is None},
                           key=stage_order)
            stages = {value: _stage(conn) for value in order}
            ids = _key_ids(conn, {k for rows in fresh for _, k, _ in rows if not k.startswith(depth_keys.PREFIX)})
            for inc, run_id, rows in zip(incoming, found, fresh, strict=True):
                if run_id is None:
                    run_id = states.create(_Within(conn), states.IMPORTER, inc.status,  # type: ignore[arg-type]
                                           **inc.columns, launch_id=stages[inc.stage])
                    done.created += 1
                done.stored += _write(conn, run_id, rows, ids)
                written += [run_id] if rows else []
    except (IntegrityError, states.ActiveTwin):  # another writer recorded the same points in the meantime
        raise AttnresError("the database changed during the import (another import or run wrote the same "
                           "points); nothing was imported: run it again") from None
    for run_id in written:  # the summaries are a cache (store.summarize): written after the commit, as at a run's end
        run_rows.summarize(engine, run_id)
    return done


def _stored_runs(conn: Connection, incoming: Sequence[Incoming]) -> list[int | None]:
    """The stored run of each incoming one (None: new): by its hash, else an earlier import's run of the
    same label, variant and seed in the same scope (each stored run taken once)."""
    claimed: set[int] = set()
    found: list[int | None] = []
    for inc in incoming:
        run_id = conn.execute(select(Run.id).where(Run.config_hash == inc.ident).order_by(Run.id)).scalar()
        if run_id is None:
            q = select(Run.id).where(Run.config_hash == inc.legacy, Run.experiment == inc.scope["experiment"],
                                     Run.preset == inc.scope["preset"])
            if inc.scope.get("total_steps") is not None:
                q = q.where(Run.total_steps == inc.scope["total_steps"])
            run_id = next((r for r in conn.execute(q.order_by(Run.id)).scalars() if r not in claimed), None)
        if run_id is not None:
            claimed.add(run_id)
        found.append(run_id)
    return found


def _new_points(conn: Connection, inc: Incoming, run_id: int | None) -> tuple[list[tuple[int, str, float]], int]:
    """The run's points the database lacks (step, key, value), and how many it holds with the same value."""
    if run_id is None:
        return [(step, key, value) for _, step, key, value in inc.rows], 0
    have = {(k, int(st)): float(v) for k, st, v in conn.execute(
        select(MetricKey.name, Metric.step, Metric.value).join(MetricKey, MetricKey.id == Metric.key_id)
        .where(Metric.run_id == run_id))}
    have |= {(depth_keys.key(site, source), int(st)): float(w) for site, source, st, w in conn.execute(
        select(DepthWeight.site, DepthWeight.source, DepthWeight.step, DepthWeight.weight)
        .where(DepthWeight.run_id == run_id))}
    new, known = [], 0
    for row, step, key, value in inc.rows:
        stored = have.get((key, step))
        if stored is None:
            new.append((step, key, value))
        elif stored == value:
            known += 1
        else:
            raise Conflict(row, step, key, value, stored, run_id)
    return new, known


def _stage(conn: Connection) -> int:
    """A launch of origin ``import``: the runs it creates are one stage (see attnres.tracking.launches)."""
    return int(conn.execute(insert(Launch).values(created_at=run_rows.now(), origin=records.IMPORT))
               .inserted_primary_key[0])


def _key_ids(conn: Connection, names: set[str]) -> dict[str, int]:
    """Ids of metric names, the missing ones created in this transaction (none written when all exist)."""
    if not names:
        return {}
    lookup = select(MetricKey.name, MetricKey.id).where(MetricKey.name.in_(sorted(names)))
    have = dict(conn.execute(lookup).all())
    if missing := sorted(names - set(have)):
        conn.execute(run_rows._insert_ignore(conn, MetricKey), [{"name": n} for n in missing])  # type: ignore[arg-type]
        have = dict(conn.execute(lookup).all())
    return have


def _write(conn: Connection, run_id: int, rows: list[tuple[int, str, float]], ids: dict[str, int]) -> int:
    """Insert a run's new points (none of them stored: a duplicate now is another writer's, an error); the run's
    summaries are stale from here. Returns the points written."""
    if not rows:
        return 0
    metrics, weights = depth_rows.split(rows)
    if metrics:
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        conn.exec_driver_sql(f"INSERT INTO metrics (run_id, key_id, step, value) VALUES ({mark}, {mark}, {mark}, "  # noqa: S608
                             f"{mark})", [(run_id, ids[k], int(st), float(v)) for st, k, v in metrics])
        conn.execute(delete(MetricSummary).where(MetricSummary.run_id == run_id))
    if weights:
        conn.execute(insert(DepthWeight), [{"run_id": run_id, **w} for w in weights])
    return len(metrics) + len(weights)
