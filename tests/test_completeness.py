"""A finished run's curve is checked whole by counting its on-schedule steps first; the steps are read only to name
what is missing, and the count never calls a curve with a hole whole."""

from __future__ import annotations

import itertools

from attnres.tracking import states
from attnres.tracking.db import get_engine
from attnres.tracking.run_store import RunStore
from attnres.variants.registry import resolve_run

LAST = 37  # not a multiple of either interval: the last step is logged on its own


def run_with(store: RunStore, log_every: int, eval_every: int, drop: set[tuple[str, int]],
             extra: set[tuple[str, int]]) -> int:
    cfg = resolve_run("standard", "tiny", 1, [f"steps={LAST}", f"log_every={log_every}", f"eval_every={eval_every}"])
    run_id = store.create_run(cfg, actor=states.IMPORTER, status=states.FINISHED)
    store.update_run(run_id, step=LAST)
    train = {*range(log_every, LAST + 1, log_every), LAST}
    evals = {0, *range(eval_every, LAST + 1, eval_every), LAST}
    rows = {("train_loss", s) for s in train} | {("eval_loss", s) for s in evals}
    store.log_metrics(run_id, [(s, k, 1.0) for k, s in sorted((rows - drop) | extra)])
    return run_id


def test_holes_are_found_whatever_else_the_curve_holds(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    cases = []
    for log_every, eval_every in ((1, 5), (2, 10), (4, 3)):
        train = sorted({*range(log_every, LAST + 1, log_every), LAST})
        evals = sorted({0, *range(eval_every, LAST + 1, eval_every), LAST})
        off = {("train_loss", 0), ("train_loss", LAST + 4), ("eval_loss", LAST + eval_every)}
        if log_every > 1:
            off.add(("train_loss", log_every + 1))  # off the schedule: never counted as one of its steps
        for drop, extra in itertools.product(
                [set(), {("train_loss", train[0])}, {("train_loss", LAST)}, {("eval_loss", 0)},
                 {("eval_loss", evals[1]), ("train_loss", train[len(train) // 2])}], [set(), off]):
            cases.append((run_with(store, log_every, eval_every, drop, extra), drop))
    for run_id, drop in cases:
        found = store.holes(store.run(run_id))
        missing = {(k, s) for k, spans in found.items() for a, b in spans for s in (a, b)}
        assert missing == drop, (run_id, found, drop)  # (each dropped step is a range of its own here)
    # a whole curve is judged by its count alone: the statement counts exactly its schedule's steps
    # (the same statement through the engine and on status's read-only sqlite3 connection)
    from attnres.tracking.completeness import ON_SCHEDULE, schedule
    from attnres.tracking.quick_reads import EngineReads, open_sqlite

    whole = next(r for r, drop in cases if not drop)
    plan = schedule(store.run(whole).config_json, LAST)
    every = {"train_loss": 1, "eval_loss": 5}  # (the first case's intervals)
    url = f"sqlite:///{tmp_path}/runs.db"
    for reads in (EngineReads(get_engine(url)), open_sqlite(url, 1.0)):
        for key, want in plan.items():
            counted = reads.all(ON_SCHEDULE, {"run": whole, "key": key, "first": min(want), "last": LAST,
                                              "every": every[key]})
            assert counted == [(len(want),)], (reads, key)
    rows = [{"id": r, "status": states.FINISHED, "total_steps": LAST, "config_json": store.run(r).config_json}
            for r, _ in cases]
    changed = store.check_complete(rows, states.MONITOR)
    assert changed == [r for r, drop in cases if drop]
    assert all(store.run(r).status == (states.INCOMPLETE if drop else states.FINISHED) for r, drop in cases)
