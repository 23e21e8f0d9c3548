"""The training entry point that ``torchrun`` starts on every rank.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m attnres.train -- \
        --variant control_block --preset tiny --seed 42 --db runs.db

Rank 0 owns the run's database row (through :class:`attnres.training.recorder.RunRecorder`): it
marks the run running, writes step-wise metrics (train loss, lr, tokens/s, peak memory, eval
loss) and a heartbeat, and records how the run ended: finished, diverged (non-finite loss, with
the step), stopped (an early-stop rule), preempted (SIGTERM, checkpoint saved) or failed (with
the error). The loop itself is :func:`attnres.training.loop.train`.
"""

from __future__ import annotations

import argparse
import json
import sys

from attnres import paths
from attnres.config import RunConfig
from attnres.logline import exit_now
from attnres.tracking import launches, store
from attnres.tracking.db import get_engine
from attnres.training import distributed
from attnres.training.loop import NullRecorder, speed_conditions, train
from attnres.training.recorder import open_recorder
from attnres.variants import check_revision, resolve_run


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    d = distributed.setup()
    engine = get_engine(args.db)
    if args.run_id is not None:
        cfg = RunConfig.from_dict(json.loads(store.get_run(engine, args.run_id).config_json))
        run_id = args.run_id
    else:
        cfg = resolve_run(args.variant, args.preset, args.seed, args.overrides, args.data)
        run_id = store.create_run(engine, cfg, log_path=None, launch_id=launches.create(engine, launches.DIRECT)) \
            if d.is_rank0 else -1
        if d.world > 1:
            import torch.distributed as dist

            box = [run_id]
            dist.broadcast_object_list(box)
            run_id = box[0]
    recorder = open_recorder(engine, run_id, d.world, d.describe(), speed_conditions(cfg.train, d)) \
        if d.is_rank0 else NullRecorder()
    try:
        check_revision(cfg, run_id)  # a run recorded by older code is not continued by this one
        ending = train(cfg, d, recorder, paths.checkpoints_dir(run_id), fresh=args.fresh)
    except BaseException as exc:
        if d.is_rank0:
            recorder.fail(exc)
        raise
    finally:
        distributed.teardown(d)
    if d.is_rank0:
        recorder.finish(ending)
    engine.dispose()
    return 0


if __name__ == "__main__":
    exit_now(main())
