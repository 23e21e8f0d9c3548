"""The training entry point that ``torchrun`` starts on every rank.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m attnres.train -- \
        --variant control_block --preset tiny --seed 42 --db runs.db

Rank 0 owns the run's database row (through :class:`attnres.training.recorder.RunRecorder`): it
marks the run running, writes step-wise metrics (train loss, lr, tokens/s, peak memory, eval
loss) and a heartbeat, and records how the run ended: finished, diverged (non-finite loss, with
the step), stopped (an early-stop rule), preempted (SIGTERM, checkpoint saved) or failed (with
the error). The loop itself is :func:`attnres.training.loop.train`.

The trainer's output is the run's log (appended to by every attempt): each attempt starts it with one header
line (:func:`attnres.training.loop.header`), numbered by the header lines earlier attempts left in the log.
"""

from __future__ import annotations

import argparse
import json
import sys

from attnres import paths
from attnres.config import RunConfig
from attnres.logline import exit_now, say
from attnres.tracking import records
from attnres.tracking.run_store import RunStore
from attnres.training import distributed
from attnres.training.loop import NullRecorder, Preemption, header_prefix, speed_conditions, train
from attnres.training.recorder import NotStarted, open_recorder
from attnres.variants.registry import check_revision, resolve_run


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="attnres.train", description=__doc__.splitlines()[0])
    p.add_argument("--run-id", type=int, help="existing run row to train (the launcher creates it)")
    p.add_argument("--variant", default="standard")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data", default="builtin")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--db", default=None, help="SQLAlchemy URL or SQLite path (default ./runs.db)")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint of the run")
    if argv[:1] == ["--"]:  # torchrun passes the separator through
        argv = argv[1:]
    return p.parse_args(argv)


def attempt_number(log_path: str | None, run_id: int) -> int:
    """This attempt's number: one more than the header lines earlier attempts wrote to the run's log (a run
    with no log, or one that cannot be read, is at its first attempt)."""
    if not log_path:
        return 1
    # "attnres run ID " and its field names: ASCII, whichever encoding wrote the separators between them
    prefix = header_prefix(run_id).split(" · ")[0].encode() + b" "
    try:
        with open(log_path, "rb") as fh:  # (bytes: a log is whatever the processes wrote)
            return 1 + sum(1 for line in fh if line.startswith(prefix) and b" variant " in line)
    except OSError:
        return 1


def main(argv: list[str] | None = None, preemption: Preemption | None = None) -> int:
    """Train the run; ``preemption``: the SIGTERM flag of a caller that trains in its own process (the inline
    backend), made before the run starts so that a SIGTERM at any point stops it with a checkpoint."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    d = distributed.setup()
    store = RunStore(args.db)
    log_path = None
    if args.run_id is not None:
        run = store.run(args.run_id)
        cfg = RunConfig.from_dict(json.loads(run.config_json))
        run_id, log_path = args.run_id, run.log_path
    else:
        cfg = resolve_run(args.variant, args.preset, args.seed, args.overrides, args.data)
        run_id = store.create_run(cfg, log_path=None, launch_id=store.new_launch(records.DIRECT)) \
            if d.is_rank0 else -1
        if d.world > 1:
            import torch.distributed as dist

            box = [run_id]
            dist.broadcast_object_list(box)
            run_id = box[0]
    recorder, not_started = NullRecorder(), None
    if d.is_rank0:
        try:
            recorder = open_recorder(store, run_id, d.world, d.describe(), speed_conditions(cfg.train, d))
        except NotStarted as exc:
            not_started = exc
    stop = not_started is not None
    if d.world > 1:
        stop = distributed.agree([stop], d)[0]  # (rank 0 alone knows; every rank must leave, none wait for it)
    if stop:
        # killed while its queue started the trainer: every rank leaves, with one line and no failure (a non-zero
        # exit would read, to torchrun and the queue, as a crash of a run that simply was not to be trained)
        if not_started is not None:
            say(f"attnres: {not_started}")
        distributed.teardown(d)
        store.close()
        return 0
    try:
        check_revision(cfg, run_id)  # a run recorded by older code is not continued by this one
        ending = train(cfg, d, recorder, paths.checkpoints_dir(run_id), fresh=args.fresh, run_id=run_id,
                       attempt=attempt_number(log_path, run_id) if d.is_rank0 else 1, preemption=preemption)
    except BaseException as exc:
        if d.is_rank0:
            recorder.fail(exc)
        raise
    finally:
        distributed.teardown(d)
    if d.is_rank0:
        recorder.finish(ending)
    store.close()
    return 0


if __name__ == "__main__":
    exit_now(main())
