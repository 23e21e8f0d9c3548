"""The verbs that act on runs: launch, resume, kill, reconcile, sync.

Each is planning (:mod:`attnres.runs.planning`), state changes (:mod:`attnres.tracking.states`) and a
backend (:mod:`attnres.runs.backends`) put together; the CLI calls these and renders what they return.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from attnres import paths, run_settings
from attnres.config import RunConfig
from attnres.errors import AttnresError
from attnres.logline import say
from attnres.runs import backends
from attnres.runs.backends import Placement, Submitted
from attnres.runs.planning import LaunchRequest, PlannedRun, check_data, git_commit
from attnres.tracking import records, states
from attnres.tracking.run_store import RunRecord, RunStore
from attnres.variants.registry import check_revision

#: what reopening a run clears: the end and the message of its last attempt
_REOPENED = {"ended_at": None, "exit_code": None, "message": None, "stop_step": None, "agent_pid": None,
             "queue_host": None, "queue_pid": None, "queue_since": None}


def _reopen(store: RunStore, run_id: int, stage: Stage, **fields: object) -> states.Outcome:
    """Queue an ended run again, its last attempt's spool recorded first, as that attempt's.

    A run that had ended (failed, killed) joins ``stage``: its seed arrives after its old stage was
    complete, and so after a look that may have been taken without it (a report tests each stage once).
    A preempted run keeps its stage, which waited for it.

    Recorded after the reopening (by the queue that saw the last attempt end, or by the next
    trainer as it starts), that spool's lines would land on the next attempt: its pid and start
    time replayed over the new ones, and a monitor would then call the live run dead. Held, the
    spool cannot be read by anyone else until the run is queued with the last attempt's process
    forgotten (``agent_pid``), which the queue checks before it records anything.
    """
    run = store.run(run_id)
    if run.status != states.PREEMPTED:
        fields["launch_id"] = stage(store)
    try:
        with store.recover(run):  # what the last attempt wrote is in before the run reopens
            return store.move(run_id, states.QUEUED, states.LAUNCHER, **_REOPENED, job_id=None, **fields)
    except AttnresError as exc:  # a spool the database cannot take: one clear error naming the run
        raise AttnresError(f"run {run_id}: {exc}") from None


class Stage:
    """The launch that the runs created now belong to: recorded when its first new run is, so a relaunch
    that only continues interrupted runs (which keep their own) adds no stage."""

    def __init__(self, origin: str = records.LAUNCH, plan: dict | None = None, study: int | None = None) -> None:
        self.origin, self.plan, self.study, self.id = origin, plan, study, None

    def __call__(self, store: RunStore) -> int:
        if self.id is None:
            self.id = store.new_launch(self.origin, self.plan, self.study)
        return self.id


def enqueue(store: RunStore, cells: Sequence[PlannedRun], req: LaunchRequest, stage: Stage | None = None) -> list[int]:
    """Create queued run rows (or reopen the interrupted run of a cell); return the ids to run, in order.

    New runs belong to ``stage`` (a launch of their own by default)."""
    ids = []
    stage = stage or Stage()
    mirrors = req.mirrors if req.mirrors is not None else store.default_mirrors()
    outside = {"mirrors_json": json.dumps(mirrors) if mirrors else None,
               "on_end_json": json.dumps(req.on_end) if req.on_end else None,
               "placement_json": req.placement.to_json()}
    for cell in cells:
        if cell.skip:
            continue
        # in a sweep, the early-stop rule's baseline is the baseline of the same cell (its lr, ...)
        rule = json.dumps({**req.rule, "settings": {k: run_settings.normal(v) for k, v in cell.cell.items()}}
                          if cell.cell else req.rule) if req.rule else None
        try:
            if cell.run_id is None:  # (no backend looks at a queued run before its log path is set)
                cell.run_id = store.create_run(cell.cfg, world_size=req.placement.nproc, git_commit=git_commit(),
                                               backend=req.backend, rule_json=rule, launch_id=stage(store),
                                               **outside)
                store.update_run(cell.run_id, log_path=str(paths.run_log(cell.run_id)))
            elif not _reopen(store, cell.run_id, stage, log_path=str(paths.run_log(cell.run_id)), backend=req.backend,
                             rule_json=rule, **outside):
                cell.skip = f"run {cell.run_id} changed meanwhile (now {store.status_of(cell.run_id)})"
                continue
        except states.ActiveTwin:  # another launch queued this config between our plan and now
            active = [r for r, s in store.runs_with_config(cell.cfg.config_hash) if s in states.ACTIVE]
            cell.skip = f"already queued or running as run {active[0] if active else '?'} (another launch)"
            continue
        except AttnresError as exc:  # its last attempt's spool could not be recorded: left as it was
            cell.skip = str(exc)
            continue
        ids.append(cell.run_id)
    paths.logs_dir().mkdir(parents=True, exist_ok=True)
    return ids


def launch(store: RunStore, req: LaunchRequest, cells: Sequence[PlannedRun], *, detach: bool = False,
           on_queued: Callable[[list[int]], Callable[[], None] | None] | None = None,
           stage: Stage | None = None, more: Sequence[tuple[LaunchRequest, Sequence[PlannedRun]]] = ()
           ) -> tuple[list[int], Submitted]:
    """Record the planned runs as queued, as one stage, and hand them to the request's backend.

    ``more`` are further (request, cells) of the same stage (``attnres next`` launches a plan of several
    commands as one), submitted with the first request's backend and placement. ``on_queued(ids)`` is
    called once the rows exist and may return a tick callback that the backend calls while it waits
    (the CLI's progress bars).
    """
    backends.get(req.backend).check_detach(detach)
    batches = [(req, cells), *more]
    ranks = backends.get(req.backend).ranks(req.placement)  # (every batch runs with the first request's placement)
    for name, vocab, seq_len, batch in {(c.cfg.data, c.cfg.model.vocab_size, c.cfg.model.seq_len,
                                         c.cfg.train.batch_size) for _, cs in batches for c in cs if not c.skip}:
        check_data(name, vocab, seq_len, batch, ranks)
    planned = [c for _, cs in batches for c in cs if not c.skip]
    stage = stage or Stage()
    ids = [run_id for r, cs in batches for run_id in enqueue(store, cs, r, stage)]
    late = [f"{c.cfg.variant} seed={c.cfg.seed}: skip: {c.skip}" for c in planned if c.skip]
    if not ids:
        return ids, Submitted(late)
    tick = on_queued(ids) if on_queued else None
    done = backends.get(req.backend).submit(store, ids, req.placement, detach=detach, on_tick=tick)
    done.lines[:0] = late
    return ids, done


def launch_plan(store: RunStore, batches: Sequence[tuple[LaunchRequest, Sequence[PlannedRun]]],
                plan: dict, *, detach: bool = False,
                on_queued: Callable[[list[int]], Callable[[], None] | None] | None = None,
                study: int | None = None) -> tuple[list[int], Submitted]:
    """Launch a plan's requests (``attnres next --launch``; each with its cells from :func:`planning.plan`) as one
    stage that records ``plan``: the comparisons it is meant to resolve and the seeds per arm it planned, which
    a report then tests as planned. ``study``: the study (``attnres study``) the stage belongs to, recorded with
    the stage itself, so an interrupted study knows every stage it launched."""
    if not batches or all(c.skip for _, cells in batches for c in cells):
        return [], Submitted([])
    (req, cells), *more = batches
    return launch(store, req, cells, detach=detach, on_queued=on_queued, stage=Stage(records.NEXT, plan, study),
                  more=more)


def reopen(store: RunStore, run_ids: Sequence[int], restart: bool = False) -> list[str]:
    """Queue interrupted runs again, to continue from their checkpoint; returns a line per run saying where it
    continues ("from step N", or "no checkpoint: starting over from step 0").

    Every run is checked first (resumable, recorded by this revision of its variant, on a known backend): a
    refusal changes nothing. With ``restart`` a run starts over from step 0: its checkpoints are
    moved aside (``checkpoints/run-ID.restart-K``, kept). Values its last attempt recorded past the
    step it continues from are dropped now, so that `attnres status` never shows one attempt's step
    beside another's losses; a run without a checkpoint keeps them until its new attempt trains (its trainer
    drops them then), so that a resume that never starts training loses nothing.
    """
    runs = [store.run(rid) for rid in run_ids]
    for r in runs:
        if r.status not in states.RESUMABLE:
            raise AttnresError(f"run {r.id} is {r.status}; only {', '.join(states.RESUMABLE)} runs can be resumed")
        config = json.loads(r.config_json or "{}")
        if "model" not in config:
            raise AttnresError(f"run {r.id} was imported (recorded elsewhere): there is nothing here to resume")
        check_revision(RunConfig.from_dict(config), r.id)
        if backends.backend_of(r) not in backends.REGISTRY:
            raise AttnresError(f"run {r.id} ran on backend '{r.backend}', which this installation does not have")
        if not restart:
            _readable_checkpoint(r)
    for r in runs:  # every spool first: a refusal then leaves no run reopened with nothing to start it
        try:
            store.recover_now(r)
        except AttnresError as exc:
            raise AttnresError(f"run {r.id}: {exc}") from None
    stage = Stage(records.RESUME)
    lines: list[str] = []
    for r in runs:
        try:
            reopened = _reopen(store, r.id, stage)
        except states.ActiveTwin:
            raise AttnresError(f"run {r.id}'s config is already queued or running as another run") from None
        if not reopened:
            raise AttnresError(f"run {r.id} changed meanwhile (now {store.status_of(r.id)}); try again")
        from attnres.training import checkpoint  # (torch: only a resume needs it)

        folder = paths.checkpoints_dir(r.id)
        hole = _first_hole(store, r)
        at = None if restart else checkpoint.step_of(folder)
        if restart or (hole is not None and at is not None and at >= hole):  # retrain from before the first hole
            _set_aside(folder)
            at = None
        if at is not None or restart or hole is not None:  # (no checkpoint: its trainer drops them once it trains)
            store.drop_metrics_after(r.id, -1 if at is None else at)
            store.update_run(r.id, step=at or 0, **({"started_at": None} if at is None else {}))
        lines.append(f"run {r.id} ({r.variant}, seed {r.seed}): "
                     + ("starting over from step 0 (--restart; its checkpoints are set aside, kept)" if restart
                        else f"retraining the steps it lacks from step {hole}: no checkpoint before them, starting "
                             "over from step 0 (its checkpoints are set aside, kept)" if hole is not None and at is None
                        else f"from step {at} of {r.total_steps} (its last checkpoint)" if at is not None
                        else "no checkpoint: starting over from step 0" + (
                            " (what it recorded stays until the new attempt trains)"
                            if store.latest_values([r.id], ["train_loss", "eval_loss"]).get(r.id) else "")))
    return lines


def _readable_checkpoint(r: RunRecord) -> None:
    """Refuse to resume a run whose checkpoints are all unreadable (cut, overwritten, foreign), before anything
    changes: resuming it would drop its recorded rows to start from step 0, and a trainer then fails on the same
    files. Starting over is the user's choice, made with ``--restart`` (which keeps the damaged files aside)."""
    from attnres.training import checkpoint  # (torch: only a resume needs it)

    folder = paths.checkpoints_dir(r.id)
    if checkpoint.exists(folder) and checkpoint.step_of(folder) is None:
        names = ", ".join(n for n in checkpoint.NAMES if (folder / n).exists())
        raise AttnresError(f"run {r.id}'s checkpoints in {folder} ({names}) are all unreadable, so there is no model "
                           f"to continue from; the run is left as it was. `attnres resume --restart {r.id}` starts it "
                           "over from step 0 (the damaged files are set aside, kept)")


def _first_hole(store: RunStore, r: RunRecord) -> int | None:
    """The first logged step an incomplete run lacks (None: not incomplete)."""
    if r.status != states.INCOMPLETE:
        return None
    found = store.holes(r)
    return min((a for rs in found.values() for a, _ in rs), default=None)


def _set_aside(folder: Path) -> None:
    """Move a run's checkpoint folder out of the way (numbered, never overwritten)."""
    if folder.exists():
        k = 1
        while (aside := folder.with_name(f"{folder.name}.restart-{k}")).exists():
            k += 1
        folder.rename(aside)


def resume(store: RunStore, run_ids: Sequence[int], *, detach: bool = False, restart: bool = False,
           on_tick: Callable[[], None] | None = None) -> Submitted:
    """Continue interrupted runs from their last checkpoint (or from step 0: ``restart``), each through the
    backend it ran on (this machine's queue, a SLURM job, ...)."""
    reconcile(store, run_ids)  # the first command after a crash: dead runs end, runs lacking rows are incomplete
    for name in {backends.backend_of(store.run(rid)) for rid in run_ids}:
        backends.get(name).check_detach(detach)
    lines = reopen(store, run_ids, restart)
    for line in lines:
        say(line)  # before the queue starts (a foreground queue returns when the runs end)
    runs = [store.run(rid) for rid in run_ids]
    done = Submitted(results=None)
    groups: dict[tuple[str, str], tuple[Placement, list[int]]] = {}  # one submission per backend and placement
    for r in runs:
        name = backends.backend_of(r)
        placement = backends.get(name).placement_of(r)
        groups.setdefault((name, placement.to_json()), (placement, []))[1].append(r.id)
    for (name, _), (placement, ids) in groups.items():
        got = backends.get(name).resume(store, ids, placement, detach=detach, on_tick=on_tick)
        done.lines += got.lines
        if got.results is not None:
            done.results = {**(done.results or {}), **got.results}
    return done


def kill(store: RunStore, run_ids: Sequence[int] | None) -> list[int]:
    """Stop the given runs (None: every queued or running run) now; returns those stopped. (A run whose process
    already died, after a crash, is recorded killed too: as resumable as a failed one, and what was asked.)"""
    ids = [r.id for r in store.active_runs()] if run_ids is None else [store.run(r).id for r in run_ids]
    return backends.kill(store, ids)


def reconcile(store: RunStore, check: Sequence[int] | None = ()) -> list[int]:
    """The one reconciler: what the database should say of runs that no process will record any more, recorded.

    Runs whose process or job is gone without an end fail (their spools read first: the trainer's own end wins),
    queued runs whose queue is gone are preempted, and the finished runs of ``check`` (None: every finished and
    incomplete run) are checked whole: incomplete with their holes named, or finished again. Called by the write
    verbs (launch, resume, ``next --launch``, a study) and ``attnres sync`` (the queue, each run's supervisor,
    settles its own runs); never by a read verb, which derives the same from
    :func:`attnres.runs.backends.unrecorded` and shows it. Returns the runs whose state changed."""
    changed = backends.reconcile(store)
    if check is None or check:
        changed += store.recheck(states.MONITOR, check)
    return list(dict.fromkeys(changed))


def _found_spools(store: RunStore) -> list[Path]:
    """The logs folder's spools (``*.spool.jsonl``), each identified as one: a file there that is not (a link to
    another file, something put there by hand) is left untouched, with one line."""
    found = []
    for path in paths.spools():
        try:
            found.append(store.spool_file(path))
        except AttnresError as exc:
            say(f"attnres: skipped {str(exc).split(': nothing was changed')[0]}", err=True)
    return found


def sync(store: RunStore, files: Sequence[Path] | None = None) -> tuple[list[tuple[Path, dict[str, int]]], list[int]]:
    """Ingest spools (default: every non-empty one under the logs folder) into the database, then reconcile every
    run (:func:`reconcile`): returns each spool's counts, and the runs whose state changed (a spool's own end, or
    the reconciler's). Named files are each identified as a run's spool first: one that is not refuses the whole
    call before anything is touched."""
    files = [store.spool_file(f) for f in files or []] or _found_spools(store)
    before = _states(store)
    done = []
    for path in files:
        with store.recover(path) as recovered:  # not while a queue, monitor or relaunch records it
            done.append((path, recovered.counts))
    # a run whose process is gone without an end it could record (a full disk) ends; a finished run whose rows the
    # database lacks is incomplete, and an incomplete one whose rows the spools held is finished
    reconcile(store, None)
    after = _states(store)  # (what the spools' own ends and the reconciler recorded, each run once)
    return done, [rid for rid, state in after.items() if before.get(rid) != state]


def _states(store: RunStore) -> dict[int, str]:
    return {int(r["id"]): str(r["status"]) for r in store.status_runs(None, None, None)[0]}
