"""The training entry point that ``torchrun`` starts on every rank.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m attnres.train -- \
        --variant control_block --preset tiny --seed 42 --db runs.db

Rank 0 owns the run's database row: it marks the run running, writes step-wise metrics
(train loss, lr, tokens/s, peak memory, eval loss) and a heartbeat, and records how the run
ended: finished, diverged (non-finite loss, with the step) or failed (with the error).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from sqlalchemy.exc import SQLAlchemyError
from torch.nn.parallel import DistributedDataParallel

from attnres import checkpoint
from attnres.config import RunConfig
from attnres.data.loader import TokenShards, TrainLoader, eval_batches
from attnres.data.prepare import dataset_path
from attnres.model import GPT
from attnres.optim import build_optimizer
from attnres.schedule import lr_at
from attnres.tracking import store
from attnres.tracking.db import get_engine
from attnres.tracking.writer import MetricWriter, ingest_spool
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


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    """Join the process group torchrun set up (gloo on CPU, nccl on GPU); single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local, device)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak CUDA allocation on GPU; peak resident set size of this process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def all_mean(value: torch.Tensor, d: Dist) -> float:
    if d.world > 1:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= d.world
    return float(value)


@torch.no_grad()
def evaluate(model: torch.nn.Module, shards: TokenShards, cfg: RunConfig, d: Dist,
             autocast: Callable[[], AbstractContextManager]) -> float:
    model.eval()
    total = torch.zeros(2, device=d.device)
    for x, y in eval_batches(shards, cfg.train.batch_size, cfg.train.eval_batches, d.rank, d.world):
        with autocast():
            _, loss = model(x.to(d.device), y.to(d.device))
        total += torch.stack([loss.float() * len(x), torch.tensor(float(len(x)), device=d.device)])
    if d.world > 1:
        dist.all_reduce(total)
    model.train()
    return float(total[0] / total[1])


class Preemption:
    """Turns SIGTERM into a flag checked between steps: save a checkpoint, then stop as preempted."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, _signum: int, _frame: object) -> None:
        self.requested = True



def agree(flags: list[bool], d: Dist) -> list[bool]:
    """Each flag set on any rank is set on all: every rank must stop at the same step."""
    t = torch.tensor([float(f) for f in flags], device=d.device)
    if d.world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(x) for x in t.tolist()]


class Heartbeat(threading.Thread):
    """Refresh the run's heartbeat every few seconds, so a dead run is noticed even between logs."""

    def __init__(self, writer: MetricWriter, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.writer, self.every = writer, every
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.writer.update_run(heartbeat_at=store.now())


def worse_than_rule(engine, run_id: int, cfg: RunConfig, step: int, value: float) -> str | None:  # noqa: ANN001
    """The early-stop verdict of the run's rule at ``step``, or None to go on."""
    try:
        rule = store.get_run(engine, run_id).rule_json
        r = json.loads(rule) if rule else None
        if r is None or step != r["at_step"]:
            return None
        base = store.eval_at_step(engine, r["baseline"], cfg.preset, step, exclude=run_id)
    except SQLAlchemyError:
        return None  # the database is away: no verdict, training goes on
    if base is None or value <= base + r["by"]:
        return None
    return f"eval loss {value:.3f} is worse than {r['baseline']}'s {base:.3f} by more than {r['by']} at step {step}"


def train(cfg: RunConfig, run_id: int, engine, d: Dist, sink: MetricWriter | None,  # noqa: ANN001
          fresh: bool = False) -> str:
    """Train one run; return its final status (finished, diverged, stopped or preempted)."""
    check_revision(cfg, run_id)  # a run recorded by older code is not continued by this one
    torch.manual_seed(cfg.seed)
    data = dataset_path(cfg.data)
    train_shards = TokenShards(data, "train", cfg.model.seq_len)
    eval_shards = TokenShards(data, "eval", cfg.model.seq_len)
    if train_shards.vocab_size > cfg.model.vocab_size:
        raise ValueError(f"data vocabulary {train_shards.vocab_size} exceeds model vocab {cfg.model.vocab_size}")
    loader = TrainLoader(train_shards, cfg.train.batch_size, cfg.seed, d.rank, d.world)

    raw_model = GPT(cfg.model).to(d.device)
    model = DistributedDataParallel(raw_model) if d.world > 1 else raw_model
    if cfg.train.compile:
        model = torch.compile(model)
    optimizer = build_optimizer(raw_model, cfg.train.lr, cfg.train.weight_decay, (cfg.train.beta1, cfg.train.beta2),
                                fused=d.device.type == "cuda")
    use_bf16 = cfg.train.dtype == "bfloat16" or (cfg.train.dtype == "auto" and d.device.type == "cuda")

    def autocast() -> AbstractContextManager:
        return torch.autocast(d.device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()

    ckpt = checkpoint.checkpoint_dir(run_id) / "last.pt"
    start = checkpoint.load(ckpt, raw_model, optimizer) if ckpt.exists() and not fresh else 0
    if sink and start:
        store.drop_metrics_after(engine, run_id, start)  # the resumed run rewrites what follows
    preemption = Preemption()
    tcfg = cfg.train
    tokens_per_step = tcfg.batch_size * cfg.model.seq_len * tcfg.grad_accum * d.world
    if start == 0:
        ev = evaluate(model, eval_shards, cfg, d, autocast)
        if sink:
            sink.add(0, eval_loss=ev)
    t_last, steps_since = time.perf_counter(), 0
    for step in range(start, tcfg.steps):
        lr = lr_at(step, tcfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=d.device)
        for micro in range(tcfg.grad_accum):
            x, y = loader.batch(step * tcfg.grad_accum + micro)
            x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
            sync = micro == tcfg.grad_accum - 1 or d.world == 1
            ctx = nullcontext() if sync else model.no_sync()
            with ctx, autocast():
                _, loss = model(x, y)
            (loss / tcfg.grad_accum).backward()
            loss_sum += loss.detach().float()
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tcfg.grad_clip)
        train_loss = all_mean(loss_sum / tcfg.grad_accum, d)
        done = step + 1
        if not (math.isfinite(train_loss) and math.isfinite(float(grad_norm))):
            if sink:
                sink.update_run(step=done, stop_step=done, message=f"non-finite loss or gradient at step {done}")
            return "diverged"  # stop before a non-finite update poisons the weights
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps_since += 1
        last = done == tcfg.steps
        if done % tcfg.log_every == 0 or last:
            elapsed = time.perf_counter() - t_last
            if sink:
                sink.add(done, train_loss=train_loss, lr=lr, grad_norm=float(grad_norm),
                         tokens_per_s=tokens_per_step * steps_since / elapsed,
                         peak_memory_bytes=peak_memory_bytes(d.device))
            t_last, steps_since = time.perf_counter(), 0
        verdict = None
        if done % tcfg.eval_every == 0 or last:
            ev = evaluate(model, eval_shards, cfg, d, autocast)
            if sink:
                sink.add(done, eval_loss=ev)
                print(f"step {done}/{tcfg.steps} train {train_loss:.4f} eval {ev:.4f}", flush=True)
            verdict = worse_than_rule(engine, run_id, cfg, done, ev) if d.main else None
            t_last = time.perf_counter()  # keep eval time out of tokens/s
        preempted, stop = agree([preemption.requested, verdict is not None], d)
        if (tcfg.checkpoint_every and done % tcfg.checkpoint_every == 0) or last or preempted:
            if d.main:
                checkpoint.save(ckpt, raw_model, optimizer, done)
        if sink and (done % tcfg.log_every == 0 or last or done % tcfg.eval_every == 0 or preempted or stop):
            sink.update_run(step=done, heartbeat_at=store.now())
        if preempted:
            return "preempted"
        if stop:
            if sink and verdict:
                sink.update_run(message=verdict, stop_step=done)
            return "stopped"
    return "finished"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    d = setup_distributed()
    engine = get_engine(args.db)
    if args.run_id is not None:
        cfg = RunConfig.from_dict(json.loads(store.get_run(engine, args.run_id).config_json))
        run_id = args.run_id
    else:
        cfg = resolve_run(args.variant, args.preset, args.seed, args.overrides, args.data)
        run_id = store.create_run(engine, cfg) if d.main else -1
        if d.world > 1:
            box = [run_id]
            dist.broadcast_object_list(box)
            run_id = box[0]
    writer = None
    if d.main:
        run = store.get_run(engine, run_id)
        writer = MetricWriter(engine, run_id, store.spool_path(run))
        if writer.spool.exists() and writer.spool.stat().st_size:
            ingest_spool(engine, writer.spool)  # what an earlier attempt could not write
        writer.update_run(**store.run_fields(engine, run_id))  # in the spool, should the db be lost
        writer.update_run(status="running", started_at=store.now(), heartbeat_at=store.now(),
                          pid=os.getpid(), host=socket.gethostname(), world_size=d.world)
    beat = Heartbeat(writer) if writer else None
    if beat:
        beat.start()
    try:
        status = train(cfg, run_id, engine, d, writer, fresh=args.fresh)
    except BaseException as exc:
        if beat and writer:
            beat.stopped.set()
            writer.update_run(status="failed", ended_at=store.now(), exit_code=1,
                              message=f"{type(exc).__name__}: {exc}"[:2000])
            writer.close()
        raise
    finally:
        if d.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
    if beat and writer:
        beat.stopped.set()
        fields: dict[str, object] = {"status": status, "ended_at": store.now(), "exit_code": 0}
        if status == "preempted":
            fields |= {"message": "SIGTERM: checkpoint saved; `attnres resume` continues it", "ended_at": None}
        writer.update_run(**fields)
        if not writer.close():
            print(f"attnres: the database is unreachable; run {run_id}'s metrics and state are in "
                  f"{writer.spool}: `attnres sync` writes them once it is back", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
