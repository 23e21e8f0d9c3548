"""What ``attnres status`` reads: the runs it lists and their latest values, in plain SQL.

The command should answer in well under a second over thousands of runs. Its statements name the few columns they
use and run where :mod:`attnres.tracking.quick_reads` says: on a read-only SQLite connection without SQLAlchemy's
import, or through the engine. Only constants of ours and placeholders are formatted into a statement (the
``noqa: S608`` lines); every value is bound. The tables are defined once, in the schema module;
``tests/test_tracker.py`` checks every column named here (:data:`NAMED`) exists there.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnres.tracking.quick_reads import Reads, in_list
from attnres.tracking.states import ACTIVE

STATUS_COLUMNS = ["id", "experiment", "preset", "variant", "seed", "status", "step", "total_steps", "stop_step",
                  "config_json", "heartbeat_at"]
#: the tables and columns the statements below name (checked against the schema by the tests)
NAMED = {"runs": [*STATUS_COLUMNS, "message"], "metrics": ["run_id", "key_id", "step", "value"],
         "metric_keys": ["id", "name"]}
_ACTIVE = ", ".join(f"'{s}'" for s in ACTIVE)  # (the state names: constants of ours)
LATEST = "SELECT value FROM metrics WHERE run_id = :run AND key_id = :key ORDER BY step DESC LIMIT 1"
MEAN = "SELECT avg(value) FROM metrics WHERE run_id = :run AND key_id = :key"


def any_active(reads: Reads) -> bool:
    """Whether some run is queued or running (only then can a dead process need reconciling)."""
    return bool(reads.all(f"SELECT id FROM runs WHERE status IN ({_ACTIVE}) LIMIT 1"))  # noqa: S608


def status_runs(reads: Reads, experiment: str | None = None, preset: str | None = None,
                recent: int | None = None) -> tuple[list[dict[str, object]], int]:
    """What ``attnres status`` lists: every active run and the ``recent`` newest others (None: all),
    oldest first, as plain dicts; and how many runs match the filter in all."""
    where, params = ["1 = 1"], {}
    for name, value in (("experiment", experiment), ("preset", preset)):
        if value is not None:
            where.append(f"{name} = :{name}")
            params[name] = value
    match = " AND ".join(where)
    q = f"SELECT {', '.join(STATUS_COLUMNS)} FROM runs WHERE {match}"  # noqa: S608
    shown = dict(params)
    if recent is not None:
        q += (f" AND (status IN ({_ACTIVE}) OR id IN (SELECT id FROM runs WHERE {match} ORDER BY id DESC"  # noqa: S608
              " LIMIT :recent))")
        shown["recent"] = recent
    with reads.batch():
        rows = [dict(zip(STATUS_COLUMNS, row, strict=True)) for row in reads.all(q + " ORDER BY id", shown)]
        total = reads.all(f"SELECT count(*) FROM runs WHERE {match}", params)[0][0] or 0  # noqa: S608
    return rows, int(total)


def latest_values(reads: Reads, run_ids: Sequence[int], keys: Sequence[str]) -> dict[int, dict[str, float]]:
    """Each run's newest value of each key: one primary-key lookup per (run, key), never a scan of the
    run's steps (a thousand runs of long curves answer in milliseconds)."""
    return _each(reads, run_ids, keys, LATEST)


def mean_values(reads: Reads, run_ids: Sequence[int], keys: Sequence[str]) -> dict[int, dict[str, float]]:
    """Each run's mean of each key over its logged values (a primary-key range per (run, key)): for
    ``tokens_per_s`` the mean over the run's timed logged intervals, the figure a report gives a run."""
    return _each(reads, run_ids, keys, MEAN)


def _each(reads: Reads, run_ids: Sequence[int], keys: Sequence[str], query: str) -> dict[int, dict[str, float]]:
    """``query`` (one value, bound to ``run`` and ``key``) for each run and key: {run: {key: value}}."""
    out: dict[int, dict[str, float]] = {r: {} for r in run_ids}
    if not run_ids:
        return out
    names, params = in_list("name", list(keys))
    with reads.batch():
        ids = dict(reads.all(f"SELECT name, id FROM metric_keys WHERE name IN ({names})", params))  # noqa: S608
        for run_id in run_ids:
            for name, key_id in ids.items():
                found = reads.all(query, {"run": run_id, "key": key_id})
                if found and found[0][0] is not None:
                    out[run_id][name] = float(found[0][0])
    return out


def messages(reads: Reads, run_ids: Sequence[int]) -> dict[int, str]:
    """Why each of these runs is where it is (its recorded message), for the runs that have one."""
    if not run_ids:
        return {}
    ids, params = in_list("run", list(run_ids))
    found = reads.all(f"SELECT id, message FROM runs WHERE id IN ({ids})", params)  # noqa: S608
    return {int(i): str(m) for i, m in found if m}
