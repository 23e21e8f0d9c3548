"""The one door to the tracking database: :class:`RunStore`, built from a URL.

Everything outside :mod:`attnres.tracking` records and reads runs through a store object, as MLflow's
code goes through its ``AbstractStore``: the engine, the ORM rows and the SQL stay in this package,
and what comes out are plain values (:class:`RunRecord`, dicts, DataFrames). The methods are grouped by
the job of the tracking module that holds their SQL: runs and metrics (:mod:`~attnres.tracking.run_rows`),
a run's life (:mod:`~attnres.tracking.lifecycle`), the three run listings (``status_runs``, the plain-SQL
path of ``attnres status``; ``runs_frame``, every column; ``run_table``, what reports group),
completeness, launches, studies, mirrors, benchmarks, depth maps, results, export and import.

Modules are imported where a method needs them: ``attnres status`` opens a ``quick`` store and reads its listing
without SQLAlchemy, the ORM or pandas (:mod:`attnres.tracking.status_reads`, on a read-only SQLite connection where it
can: :mod:`attnres.tracking.quick_reads`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnres.tracking import status_reads, urls
from attnres.tracking.quick_reads import EngineReads, Reads, SqliteReads, open_sqlite
from attnres.tracking.records import RunRecord

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy import Engine

    from attnres.config import RunConfig
    from attnres.tracking.lifecycle import Recovery
    from attnres.tracking.report_reads import Results, Tables
    from attnres.tracking.states import Outcome
    from attnres.tracking.studies import Studies
    from attnres.tracking.writer import MetricWriter


class RunStore:
    """The tracking database at ``url`` (a SQLAlchemy URL or a SQLite file path; default ``$ATTNRES_DB``).

    ``create`` off: a missing SQLite file is an error, not a new database (the read verbs). ``busy_s``: how long a
    statement waits for another process's lock (a command that must answer at once gives less). Stores of one
    database share its engine (one pool per process). ``quick`` (``attnres status``): over a SQLite file of this
    attnres's schema, the listing's reads run on a read-only connection (:mod:`~attnres.tracking.quick_reads`) and
    the engine, SQLAlchemy with it, opens when another method needs it; elsewhere it opens now, as without."""

    def __init__(self, url: str | None = None, *, create: bool = True, busy_s: float | None = None,
                 quick: bool = False) -> None:
        self.url = urls.normalize_url(url)
        self._quick = open_sqlite(self.url, urls.busy_timeout_s() if busy_s is None else busy_s) if quick else None
        self._opening, self._opened = (self.url if quick else url, create, busy_s), None  # (later: this file)
        if self._quick is None:
            _ = self._engine  # (opened now: a database that cannot be used is said at once, a new one made)

    @property
    def _engine(self) -> Engine:
        if self._opened is None:
            from attnres.tracking import db
            url, create, busy_s = self._opening
            self._opened = db.get_engine(url, create=create, busy_s=busy_s)
        return self._opened

    @property
    def _reads(self) -> Reads:  # where the listing's statements run: a quick store's connection, else the engine
        return self._quick if self._quick is not None else EngineReads(self._engine)

    def __repr__(self) -> str:
        return f"RunStore({self.public_url!r})"

    @staticmethod
    def exists(url: str | None) -> bool:
        """Whether there is a database to read at ``url`` (a server database is assumed to be there)."""
        return urls.exists(url)

    # -- where it is ----------------------------------------------------------------------------------
    @property
    def public_url(self) -> str:
        """The URL without user name or password (it goes into shared documents)."""
        return urls.public_url(self.url)

    @property
    def is_default(self) -> bool:
        """Whether this is the database commands use without ``--db``."""
        return self.url == urls.normalize_url(None)

    def database_id(self) -> str:
        """A short digest of where the database is (a run's identity in a mirror is its id and this)."""
        import hashlib

        url = self._engine.url
        where = str(url.database or "")
        if url.get_backend_name() == "sqlite" and where and where != ":memory:":
            where = str(Path(where).resolve())
        return hashlib.sha256(f"{url.get_backend_name()}://{url.host or ''}:{url.port or ''}/{where}".encode()
                              ).hexdigest()[:8]

    def check_location(self) -> None:
        """Raise OSError when a SQLite database's file is gone (a replaced one is opened anew)."""
        from attnres.tracking import db

        db.check_location(self._engine)

    def close(self) -> None:
        """Close the pooled connections (a process about to leave, or to fork)."""
        if isinstance(self._quick, SqliteReads):
            self._quick.close()
            self._quick = None
        if self._opened is not None:  # (a quick store may never have opened one)
            self._opened.dispose()

    @staticmethod
    def forget_all() -> None:
        """Drop every database this process opened (temporary ones deleted; a schema an upgrade changed)."""
        from attnres.tracking import db

        db.forget_engines()

    # -- runs -----------------------------------------------------------------------------------------
    def create_run(self, cfg: RunConfig, **columns: object) -> int:
        """A new run row for ``cfg`` (queued, the launcher's, unless ``actor``/``status`` say otherwise)."""
        from attnres.tracking import run_rows

        return run_rows.create_run(self._engine, cfg, **columns)

    def run(self, run_id: int) -> RunRecord:
        """The run as recorded now (AttnresError: no such run)."""
        from attnres.tracking import run_rows

        return RunRecord.of(run_rows.get_run(self._engine, run_id))

    def status_of(self, run_id: int) -> str | None:
        """A run's status now (None: no such run)."""
        from attnres.tracking import run_rows

        return run_rows.status_of(self._engine, run_id)

    def update_run(self, run_id: int, *, where: dict[str, object] | None = None, **columns: object) -> None:
        """Change a run's bookkeeping columns, never its status (that is :meth:`move`)."""
        from attnres.tracking import run_rows

        run_rows.update_run(self._engine, run_id, where=where, **columns)

    def runs_with_config(self, config_hash: str) -> list[tuple[int, str]]:
        """(id, status) of the runs with exactly this config, oldest first."""
        from attnres.tracking import run_rows

        return run_rows.runs_with_config(self._engine, config_hash)

    def active_runs(self) -> list[RunRecord]:
        """The queued and running runs."""
        from attnres.tracking import run_rows

        return [RunRecord.of(r) for r in run_rows.active_runs(self._engine)]

    def run_fields(self, run_id: int) -> dict[str, object]:
        """A run's row as a dict without its id (what a spool keeps, should the database be lost)."""
        from attnres.tracking import run_rows

        return run_rows.run_fields(self._engine, run_id)

    def eval_at_step(self, variant: str, experiment: str, step: int, **scope: Any) -> float | None:
        """Mean eval loss of a variant's runs at ``step`` (see :func:`attnres.tracking.run_rows.eval_at_step`)."""
        from attnres.tracking import run_rows

        return run_rows.eval_at_step(self._engine, variant, experiment, step, **scope)

    def log_metrics(self, run_id: int, rows: Sequence[tuple[int, str, float]]) -> int:
        """Write (step, key, value) rows of a run; returns how many were new."""
        from attnres.tracking import run_rows

        return run_rows.log_metrics(self._engine, run_id, rows)

    def summarize(self, run_id: int) -> None:
        """Write a run's per-key summaries from its rows (at its end, or after rows came in another way)."""
        from attnres.tracking import run_rows

        run_rows.summarize(self._engine, run_id)

    def drop_metrics_after(self, run_id: int, step: int) -> None:
        """Delete a run's values past ``step`` (a resumed attempt writes them again)."""
        from attnres.tracking import run_rows

        run_rows.drop_metrics_after(self._engine, run_id, step)

    # -- a run's life ---------------------------------------------------------------------------------
    def move(self, run_id: int, to: str, actor: str, *, where: dict[str, object] | None = None,
             **columns: object) -> Outcome:
        """Record a state change; an end starts the run's ``--on-end`` (:func:`attnres.tracking.lifecycle.move`)."""
        from attnres.tracking import lifecycle

        return lifecycle.move(self._engine, run_id, to, actor, where=where, **columns)

    @contextmanager
    def recover(self, run: RunRecord | Path, **options: Any) -> Iterator[Recovery]:
        """Hold a run's spool (a record's, or a spool file) and write what it holds into the database; the
        caller judges the run inside, under the same lock (:func:`attnres.tracking.lifecycle.recover`)."""
        from attnres.tracking import lifecycle

        with lifecycle.recover(self._engine, _spool(run), **options) as done:
            yield done

    def recover_now(self, run: RunRecord | Path, **options: Any) -> Recovery:
        """:meth:`recover` where nothing is judged under the lock."""
        from attnres.tracking import lifecycle

        return lifecycle.recover_now(self._engine, _spool(run), **options)

    @staticmethod
    def spool_file(path: Path) -> Path:
        """``path`` if it is a run's spool (a link: the spool it names); else AttnresError, one line, and nothing
        touched: what :meth:`recover` may be given by a user (:func:`attnres.tracking.spool.identify`)."""
        from attnres.tracking import spool

        return spool.identify(path)

    @contextmanager
    def hold(self, run: RunRecord) -> Iterator[None]:
        """Hold a run's spool lock without reading it: no resume reopens the run, no monitor judges it, meanwhile."""
        from attnres.tracking import spool

        with spool.held(run.spool):
            yield

    def writer(self, run: RunRecord, **options: Any) -> MetricWriter:
        """The background writer of a run's metrics and changes, through its spool."""
        from attnres.tracking.writer import MetricWriter

        return MetricWriter(self._engine, run.id, run.spool, **options)

    # -- the three run listings -----------------------------------------------------------------------
    def status_runs(self, experiment: str | None = None, preset: str | None = None,
                    recent: int | None = None) -> tuple[list[dict[str, object]], int]:
        """What ``attnres status`` lists (active runs and the ``recent`` last), and how many match: plain SQL, no
        ORM, no pandas (:mod:`attnres.tracking.status_reads`)."""
        return status_reads.status_runs(self._reads, experiment, preset, recent)

    def runs_frame(self, statuses: Sequence[str] | None = None, experiment: str | None = None,
                   preset: str | None = None) -> pd.DataFrame:
        """Every column of the runs (optionally by status, experiment, preset), one row each."""
        from attnres.tracking import run_rows

        return run_rows.runs_frame(self._engine, statuses, experiment, preset)

    def run_table(self, experiment: str | None = None, preset: str | None = None) -> pd.DataFrame:
        """The runs as reports group them (with their last step and budgets)."""
        from attnres.tracking import report_reads

        return report_reads.run_table(self._engine, experiment, preset)

    def metrics_frame(self, keys: Sequence[str], run_ids: Sequence[int] | None = None,
                      steps: Sequence[int] | None = None) -> pd.DataFrame:
        """Long-format values (run_id, key, step, value) of the given keys (of the runs, at the steps, given)."""
        from attnres.tracking import run_rows

        return run_rows.metrics_frame(self._engine, keys, run_ids, steps)

    def latest_values(self, run_ids: Sequence[int], keys: Sequence[str]) -> dict[int, dict[str, float]]:
        """Each run's last value of each key (status's columns)."""
        return status_reads.latest_values(self._reads, run_ids, keys)

    def mean_values(self, run_ids: Sequence[int], keys: Sequence[str]) -> dict[int, dict[str, float]]:
        """Each run's mean of each key over its logged values (status's tok/s, as a report gives it)."""
        return status_reads.mean_values(self._reads, run_ids, keys)

    def any_active(self) -> bool:
        """Whether some run is queued or running."""
        return status_reads.any_active(self._reads)

    def messages(self, run_ids: Sequence[int]) -> dict[int, str]:
        """The recorded message (why it ended) of each run that has one."""
        return status_reads.messages(self._reads, run_ids)

    # -- completeness ---------------------------------------------------------------------------------
    def check_complete(self, rows: Iterable[dict[str, object]], actor: str) -> list[int]:
        """Mark finished runs whose logged steps have holes incomplete, and whole ones finished again."""
        from attnres.tracking import completeness

        return completeness.check(self._engine, rows, actor)

    def holes(self, run: RunRecord) -> dict[str, list[tuple[int, int]]]:
        """The step ranges a run's schedule logged that the database lacks, by key."""
        from attnres.tracking import completeness

        return completeness.holes(self._reads, run.id, run.config_json, run.total_steps)

    def recheck(self, actor: str, run_ids: Iterable[int] | None = None) -> list[int]:
        """:meth:`check_complete` over every finished and incomplete run (or those of ``run_ids``)."""
        from attnres.tracking import completeness

        return completeness.recheck(self._engine, actor, run_ids)

    def missing(self, rows: Iterable[dict[str, object]]) -> dict[int, str]:
        """What each finished or incomplete run among ``rows`` lacks (``train_loss steps 14-16``), read only."""
        from attnres.tracking import completeness

        return {rid: completeness.text(found) for rid, found in completeness.missing(self._reads, rows).items()}

    # -- launches -------------------------------------------------------------------------------------
    def new_launch(self, origin: str, plan: Mapping[str, object] | None = None, study: int | None = None) -> int:
        """Record a launch (a stage: the runs one command created; of ``study``, if one) and return its id."""
        from attnres.tracking import launches

        return launches.create(self._engine, origin, plan, study)

    def launches_frame(self) -> pd.DataFrame:
        """Every launch, with its plan."""
        from attnres.tracking import launches

        return launches.frame(self._engine)

    # -- studies -------------------------------------------------------------------------------------
    @property
    def studies(self) -> Studies:
        """The studies (``attnres study``): their rows, drivers and stages' runs (:mod:`attnres.tracking.studies`)."""
        from attnres.tracking.studies import Studies

        return Studies(self._engine)

    # -- mirrors --------------------------------------------------------------------------------------
    def default_mirrors(self) -> list[str] | None:
        """The trackers new runs are sent to by default (``attnres mirror``)."""
        from attnres.tracking import mirror_marks

        return mirror_marks.default_mirrors(self._engine)

    def set_default_mirrors(self, specs: Sequence[str] | None) -> None:
        from attnres.tracking import mirror_marks

        mirror_marks.set_default_mirrors(self._engine, specs)

    def mirror_marks(self, run_id: int, target: str) -> dict[str, int]:
        """The last step of each key a mirror has of a run."""
        from attnres.tracking import mirror_marks

        return mirror_marks.marks(self._engine, run_id, target)

    def save_mirror_marks(self, run_id: int, target: str, reached: Mapping[str, int]) -> None:
        from attnres.tracking import mirror_marks

        mirror_marks.save_marks(self._engine, run_id, target, reached)

    def unsent(self, run_id: int, after: Mapping[str, int]) -> list[tuple[int, dict[str, float]]]:
        """A run's values past a mirror's marks, by step."""
        from attnres.tracking import mirror_marks

        return mirror_marks.unsent(self._engine, run_id, after)

    def mirrored_runs(self, run_ids: Sequence[int] | None = None) -> list[RunRecord]:
        """The runs (default all) that name mirrors."""
        from attnres.tracking import mirror_marks

        return [RunRecord.of(r) for r in mirror_marks.mirrored_runs(self._engine, run_ids)]

    # -- benchmarks, depth maps, results --------------------------------------------------------------
    def record_bench(self, rows: Sequence[Mapping[str, Any]], device: str, threads: int, dtype: str,
                     preset: str, overrides: Sequence[str], steps: int) -> int:
        """Keep one ``attnres bench`` session's rows; returns its session id."""
        from attnres.tracking import speed

        return speed.record_bench(self._engine, rows, device, threads, dtype, preset, overrides, steps)

    def depth_steps(self, run_id: int) -> list[int]:
        """The steps at which a run's depth-attention maps were recorded."""
        from attnres.tracking import depth_rows

        return depth_rows.steps(self._engine, run_id)

    def depth_maps(self, run_ids: Sequence[int], step: int | None = None) -> pd.DataFrame:
        from attnres.tracking import depth_rows

        return depth_rows.maps(self._engine, run_ids, step)

    def report_tables(self) -> Tables:
        """The run rows, stages, benches and studies a report reads first (:mod:`attnres.tracking.report_reads`)."""
        from attnres.tracking import report_reads
        return report_reads.tables(self._engine)

    def load_results(self, variants: list[str] | None = None, step: int | None = None,
                     runs: pd.DataFrame | None = None) -> Results:
        """What a report reads: runs, their evals and depth maps (:mod:`attnres.tracking.report_reads`)."""
        from attnres.tracking import report_reads

        return report_reads.load_results(self._engine, variants, step, runs)

    # -- export and import ----------------------------------------------------------------------------
    def export(self, out: Path, fmt: str = "csv", experiment: str | None = None,
               preset: str | None = None) -> list[Path]:
        from attnres.tracking import transfer

        return transfer.export(self._engine, out, fmt, experiment, preset)

    def import_file(self, path: Path, frame: pd.DataFrame | None = None) -> dict[str, int]:
        from attnres.tracking import transfer

        return transfer.import_file(self._engine, path, frame)


def _spool(run: RunRecord | Path) -> Path:
    return run.spool if isinstance(run, RunRecord) else Path(run)
