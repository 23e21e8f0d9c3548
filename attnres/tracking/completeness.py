"""A finished run is a complete run: the database holds every logged step of every key up to its last step.

A run logs its train loss every ``log_every`` steps (and at its last step) and evaluates at step 0, every
``eval_every`` steps and at its last step. A run recorded ``finished`` while some of those rows never reached
the database (a spool lost with its trainer, two writers on one spool) would report from a curve with a hole
and say nothing. Where a run ends (its queue settles it) and when ``attnres status`` shows it, the rows are
counted against that schedule; a run with a hole becomes ``incomplete``, the missing ranges named, and
``attnres resume`` retrains them (from the last checkpoint before the first hole, else from step 0); a sync
that brings the rows marks it finished again.

Plain SQL (:mod:`attnres.tracking.quick_reads`: ``attnres status`` counts on a read-only SQLite connection, without
SQLAlchemy's import); the state change imports the ORM when needed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from attnres.tracking.quick_reads import EngineReads, Reads, in_list
from attnres.tracking.states import FINISHED, INCOMPLETE

if TYPE_CHECKING:
    from sqlalchemy import Engine

KEYS = ("train_loss", "eval_loss")
_FROM = ("FROM metrics JOIN metric_keys ON metrics.key_id = metric_keys.id"
         " WHERE metrics.run_id = :run AND metric_keys.name = :key")
# a key's steps on its schedule in [first, last] (`status --all` counts them twice per finished run)
ON_SCHEDULE = (f"SELECT count(*) {_FROM} AND metrics.step BETWEEN :first AND :last"
               " AND (metrics.step % :every = 0 OR metrics.step = :last)")
STEPS = f"SELECT metrics.step {_FROM}"


def intervals(config_json: str | None) -> dict[str, int] | None:
    """Each key's logging interval in a run's config (None: a run recorded elsewhere, with no schedule of ours)."""
    try:
        train = json.loads(config_json or "{}")["train"]
        every = {"train_loss": int(train["log_every"]), "eval_loss": int(train["eval_every"])}
    except (ValueError, KeyError, TypeError):
        return None
    return every if min(every.values()) >= 1 else None


def schedule(config_json: str | None, last: int) -> dict[str, set[int]] | None:
    """The steps at which a run trained here logs each key, up to ``last`` (None: a run recorded elsewhere)."""
    every = intervals(config_json)
    return None if every is None else _steps(every, last)


def _steps(every: dict[str, int], last: int) -> dict[str, set[int]]:
    log_every, eval_every = every["train_loss"], every["eval_loss"]
    return {"train_loss": {s for s in range(log_every, last + 1, log_every)} | {last},
            "eval_loss": {0, *range(eval_every, last + 1, eval_every), last}}


def ranges(steps: Iterable[int], expected: Sequence[int]) -> list[tuple[int, int]]:
    """The missing ``steps`` as runs of consecutive entries of the ``expected`` schedule: [(first, last)]."""
    missing, out, prev = set(steps), [], -2
    for i, s in enumerate(expected):
        if s not in missing:
            continue
        if out and prev == i - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
        prev = i
    return out


def holes(reads: Reads, run_id: int, config_json: str | None, last: int) -> dict[str, list[tuple[int, int]]]:
    """Each key's missing ranges of steps for a run that reached ``last`` ({}: complete, or not ours to judge).

    A key is first counted in the database: its on-schedule steps (a multiple of its interval, or the last step;
    the primary key holds each step once) numbering the schedule's is a whole curve, read no further. Only a key
    short of its count has its steps read to name the missing ranges (`attnres status` checks the finished runs
    it shows at every call: 20 of them at paper scale were 12,000 steps read, now 40 counts)."""
    every = intervals(config_json)
    if every is None:
        return {}
    out = {}
    with reads.batch():
        for key, want in _steps(every, last).items():
            count = reads.all(ON_SCHEDULE, {"run": run_id, "key": key, "first": min(want), "last": last,
                                            "every": every[key]})[0][0]
            if count == len(want):
                continue
            have = {int(s) for (s,) in reads.all(STEPS, {"run": run_id, "key": key})}
            if want - have:
                out[key] = ranges(want - have, sorted(want))
    return out


def text(found: dict[str, list[tuple[int, int]]]) -> str:
    """``train_loss steps 541-730, 800; eval_loss step 550``."""
    def one(a: int, b: int) -> str:
        return f"{a}" if a == b else f"{a}-{b}"

    return "; ".join(f"{key} step{'s' if len(r) > 1 or r[0][0] != r[0][1] else ''} "
                     + ", ".join(one(a, b) for a, b in r[:6]) + (f" (+{len(r) - 6} more)" if len(r) > 6 else "")
                     for key, r in found.items())


def missing(reads: Reads, rows: Iterable[dict[str, object]]) -> dict[int, dict[str, list[tuple[int, int]]]]:
    """The holes of each finished or incomplete run among ``rows`` (id, status, total_steps, config_json) that has
    some: what :func:`check` would judge, read only (what `attnres status` shows of a hole not recorded yet)."""
    out = {}
    with reads.batch():
        for r in rows:
            if r["status"] not in (FINISHED, INCOMPLETE):
                continue
            found = holes(reads, int(r["id"]), r.get("config_json"), int(r["total_steps"]))
            if found:
                out[int(r["id"])] = found
    return out


def why(run_id: int, found: dict[str, list[tuple[int, int]]]) -> str:
    """The message of a run recorded incomplete: what it lacks, and the two ways to make it whole."""
    return (f"incomplete: the database lacks {text(found)}; `attnres sync` brings them from a spool that holds "
            f"them, `attnres resume {run_id}` retrains them")


def check(engine: Engine, rows: Iterable[dict[str, object]], actor: str) -> list[int]:
    """Mark finished runs among ``rows`` (id, status, total_steps, config_json) with holes ``incomplete``, and
    incomplete ones whose rows are all in again ``finished``; returns the runs whose state changed."""
    rows = [r for r in rows if r["status"] in (FINISHED, INCOMPLETE)]
    found = missing(EngineReads(engine), rows)
    changed = []
    for r in rows:
        rid = int(r["id"])
        if (rid in found) == (r["status"] == INCOMPLETE):
            continue
        from attnres.tracking import lifecycle  # (the ORM: only when a state changes)

        if rid in found:
            done = lifecycle.move(engine, rid, INCOMPLETE, actor, where={"status": FINISHED},
                                  message=why(rid, found[rid]))
        else:
            done = lifecycle.move(engine, rid, FINISHED, actor, where={"status": INCOMPLETE}, message=None)
        if done:
            changed.append(rid)
    return changed


def recheck(engine: Engine, actor: str, run_ids: Iterable[int] | None = None) -> list[int]:
    """:func:`check` over every finished and incomplete run (or those of ``run_ids``): a finished run whose rows
    are lost is incomplete, an incomplete one whose rows came back (a sync) finished."""
    q = f"SELECT id, status, total_steps, config_json FROM runs WHERE status IN ('{FINISHED}', '{INCOMPLETE}')"  # noqa: S608
    params: dict[str, object] = {}
    if run_ids is not None:
        ids, params = in_list("run", list(run_ids))
        q += f" AND id IN ({ids})"  # (placeholders; values bound)
    rows = [dict(zip(("id", "status", "total_steps", "config_json"), r, strict=True))
            for r in EngineReads(engine).all(q, params)]
    return check(engine, rows, actor)
