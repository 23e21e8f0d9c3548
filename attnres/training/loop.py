"""The training loop of one run, on every rank; it knows nothing of databases.

What the loop observes (metrics, progress, evals) goes to a :class:`Recorder`; whether to stop
early is the recorder's verdict; how the run ended is the returned :class:`Ending`. Rank 0 of a
tracked run gets :class:`attnres.training.recorder.RunRecorder`; other ranks, and in-process use
(tests, notebooks), get :class:`MemoryRecorder` or :class:`NullRecorder`.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import torch
from torch.nn.parallel import DistributedDataParallel

from attnres import depth_keys, paths
from attnres.config import RunConfig, TrainConfig
from attnres.data.loader import TokenShards, TrainLoader, eval_batches
from attnres.logline import say
from attnres.model import flops
from attnres.model.gpt import GPT
from attnres.tracking import states
from attnres.training import checkpoint
from attnres.training.distributed import Dist, agree, all_mean, device_model, sum_over_ranks
from attnres.training.lr_schedule import lr_at
from attnres.training.optim import build_optimizer

#: besides the eval lines, rank 0 prints a progress line on an attempt's first step and then whenever this many
#: seconds passed since its last printed line, so that a run's log shows it going within seconds
PRINT_EVERY_S = 10.0


@dataclass
class Ending:
    """How the loop ended: finished, diverged, stopped (early-stop rule) or preempted (SIGTERM)."""

    status: str
    step: int
    message: str | None = None


class Recorder(Protocol):
    """What the loop tells the outside world."""

    def resumed(self, step: int) -> None:
        """Training continues from a checkpoint at ``step``: what was recorded after it is stale."""

    def record(self, step: int, **values: float) -> None:
        """Metric values of one step."""

    def progress(self, step: int) -> None:
        """``step`` steps are done (and the run is alive)."""

    def verdict(self, step: int, eval_loss: float) -> str | None:
        """Why to stop early after this eval, or None to go on."""


class NullRecorder:
    """Records nothing: ranks other than 0."""

    def resumed(self, step: int) -> None: ...

    def record(self, step: int, **values: float) -> None: ...

    def progress(self, step: int) -> None: ...

    def verdict(self, step: int, eval_loss: float) -> str | None:
        return None


@dataclass
class MemoryRecorder:
    """Keeps what was recorded in memory; ``stop_at`` (step -> reason) plays an early-stop rule."""

    metrics: dict[str, dict[int, float]] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)
    stop_at: dict[int, str] = field(default_factory=dict)

    def resumed(self, step: int) -> None:
        for curve in self.metrics.values():
            for s in [s for s in curve if s > step]:
                del curve[s]

    def record(self, step: int, **values: float) -> None:
        for key, value in values.items():
            self.metrics.setdefault(key, {})[step] = value

    def progress(self, step: int) -> None:
        self.steps.append(step)

    def verdict(self, step: int, eval_loss: float) -> str | None:
        return self.stop_at.get(step)


class Preemption:
    """Turns SIGTERM into a flag checked between steps: save a checkpoint, then stop as preempted."""

    def __init__(self) -> None:
        self.requested = False
        try:
            signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread (in-process use): no preemption by signal
            pass

    def _handle(self, _signum: int, _frame: object) -> None:
        self.requested = True


def peak_memory_bytes(device: torch.device) -> int:
    """Peak CUDA allocation on GPU (since the run began: :func:`train` resets it); on CPU the peak resident set
    size of this process (Linux's VmHWM, which a process that trains several runs resets before each: see
    :mod:`attnres.runs.backends.inline`; elsewhere the lifetime peak)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@torch.no_grad()
def evaluate(model: torch.nn.Module, shards: TokenShards, cfg: RunConfig, d: Dist,
             autocast: Callable[[], AbstractContextManager],
             residual: torch.nn.Module | None = None) -> dict[str, float]:
    """Mean eval loss over the held-out batches of every rank, as ``{"eval_loss": ...}``; with a
    depth-attention ``residual``, also this rank's depth map: each site's mean weight per source
    (keys of :func:`attnres.depth_keys.key`), recorded before the loss."""
    model.eval()
    tally = residual is not None and hasattr(residual, "tally_maps")
    if tally:
        residual.tally_maps()
    total = torch.zeros(2, device=d.device)
    try:
        for x, y in eval_batches(shards, cfg.train.batch_size, cfg.train.eval_batches, d.rank, d.world):
            with autocast():
                _, loss = model(x.to(d.device), y.to(d.device))
            total += torch.stack([loss.float() * len(x), torch.tensor(float(len(x)), device=d.device)])
    finally:
        weights = residual.depth_map() if tally else {}
    sum_over_ranks(total, d)
    model.train()
    out = {depth_keys.key(site, source): w for (site, source), w in sorted(weights.items())}
    return out | {"eval_loss": float(total[0] / total[1])}


def compiles(tcfg: TrainConfig, device: torch.device) -> bool:
    """Whether a run is trained through ``torch.compile``: on CUDA unless turned off, elsewhere if asked."""
    return bool(tcfg.compile or (device.type == "cuda" and tcfg.compile_cuda))


def uses_bf16(tcfg: TrainConfig, device: torch.device) -> bool:
    """Whether steps run under bfloat16 autocast: asked for, or ``auto`` on CUDA."""
    return tcfg.dtype == "bfloat16" or (tcfg.dtype == "auto" and device.type == "cuda")


#: How this process came to train (:func:`started_as`): "interpreter" (its own, as torchrun starts a worker of a
#: module), "forked" (from torchrun's agent: :mod:`attnres.runs.fork_worker`) or "inline" (the launching process:
#: :mod:`attnres.runs.backends.inline`). A CPU's peak memory (the whole process's resident set) depends on it.
_PROCESS = ["interpreter"]


def started_as(kind: str) -> None:
    """Say how this process came to train (see :data:`_PROCESS`), before its first run."""
    _PROCESS[0] = kind


def speed_conditions(tcfg: TrainConfig, d: Dist) -> dict[str, object]:
    """What this attempt's tokens/s depends on besides its variant (:mod:`attnres.tracking.speed`): device
    model, world size, compute threads per process (the launcher sets them to fit the cores), compile, dtype;
    and how its process started, which its CPU peak memory depends on."""
    return {"device": device_model(d.device), "world_size": d.world, "threads": torch.get_num_threads(),
            "compile": compiles(tcfg, d.device), "dtype": "bfloat16" if uses_bf16(tcfg, d.device) else "float32",
            "process": _PROCESS[0]}


def header_prefix(run_id: int | None) -> str:
    """How an attempt's header line (:func:`header`) of run ``run_id`` starts; its log's attempts are counted by it."""
    return f"attnres run {'untracked' if run_id is None else run_id} · "


def header(cfg: RunConfig, d: Dist, start: int, started: datetime, run_id: int | None = None,
           attempt: int = 1) -> str:
    """The line an attempt starts its run's log with: who the run is, what trains it, when, and from which step."""
    fields = [f"variant {cfg.variant}", f"seed {cfg.seed}", f"config {cfg.config_hash}",
              f"device {device_model(d.device)}", f"threads {torch.get_num_threads()}",
              f"started {started:%Y-%m-%d %H:%M:%S} UTC", f"attempt {attempt}",
              f"resumed from step {start}" if start else "starting at step 0"]
    return header_prefix(run_id) + " · ".join(fields)


def train(cfg: RunConfig, d: Dist, recorder: Recorder, ckpt: Path, fresh: bool = False,
          preemption: Preemption | None = None, run_id: int | None = None, attempt: int = 1) -> Ending:
    """Train one run from its checkpoint folder ``ckpt`` (unless ``fresh``) to its last step, or an early end.

    Rank 0 first prints the attempt's :func:`header` (``run_id``: the run's row, None in-process; ``attempt``: its
    number among the run's attempts), then a progress line on the first step and every :data:`PRINT_EVERY_S` seconds,
    and one line at each eval. A checkpoint is saved every ``checkpoint_every`` steps (0: at each eval), at the last
    step and on preemption.
    """
    started = datetime.now(UTC)
    if d.device.type == "cuda":  # (this run's peak, not an earlier one's in the same process)
        torch.cuda.reset_peak_memory_stats(d.device)
    torch.manual_seed(cfg.seed)
    data = paths.dataset(cfg.data)
    train_shards = TokenShards(data, "train", cfg.model.seq_len)
    eval_shards = TokenShards(data, "eval", cfg.model.seq_len)
    if train_shards.vocab_size > cfg.model.vocab_size:
        raise ValueError(f"data vocabulary {train_shards.vocab_size} exceeds model vocab {cfg.model.vocab_size}")
    loader = TrainLoader(train_shards, cfg.train.batch_size, cfg.seed, d.rank, d.world)

    raw_model = GPT(cfg.model).to(d.device)
    model = DistributedDataParallel(raw_model) if d.world > 1 else raw_model
    tcfg = cfg.train
    compiled = compiles(tcfg, d.device)
    if compiled:
        model = torch.compile(model)
    optimizer = build_optimizer(raw_model, tcfg.lr, tcfg.weight_decay, (tcfg.beta1, tcfg.beta2),
                                fused=d.device.type == "cuda", compiled=compiled)
    use_bf16 = uses_bf16(tcfg, d.device)

    def autocast() -> AbstractContextManager:
        return torch.autocast(d.device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()

    start = checkpoint.load(ckpt, raw_model, optimizer) if checkpoint.exists(ckpt) and not fresh else 0
    saved = start  # the step of the newest checkpoint on disk (0: none of this run to continue from)
    if d.is_rank0:
        say(header(cfg, d, start, started, run_id, attempt))
    recorder.resumed(start)  # the resumed run rewrites what follows its checkpoint (a restart: all it recorded)
    preemption = preemption or Preemption()
    tokens_per_step = flops.tokens_per_step(cfg, d.world)
    # training compute so far, what a scaling law is fitted against (attnres.model.flops)
    flops_per_step = flops.training_flops(cfg, raw_model.num_params()["non_embedding"], d.world, steps=1)
    if start == 0:
        recorder.record(0, **evaluate(model, eval_shards, cfg, d, autocast, raw_model.residual))
    t_last, steps_since = time.perf_counter(), 0
    t_first = t_last
    t_said, steps_unsaid = t_last, 0  # the last progress line printed (or eval), and the steps since
    for step in range(start, tcfg.steps):
        lr = lr_at(step, tcfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=d.device)
        for micro in range(tcfg.grad_accum):
            x, y = loader.batch(step * tcfg.grad_accum + micro)
            x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
            sync = micro == tcfg.grad_accum - 1 or d.world == 1
            with nullcontext() if sync else model.no_sync(), autocast():
                _, loss = model(x, y)
            (loss / tcfg.grad_accum).backward()
            loss_sum += loss.detach().float()
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tcfg.grad_clip)
        train_loss = all_mean(loss_sum / tcfg.grad_accum, d)
        done = step + 1
        if not (math.isfinite(train_loss) and math.isfinite(float(grad_norm))):
            # stop before a non-finite update poisons the weights
            return Ending(states.DIVERGED, done, f"non-finite loss or gradient at step {done}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if compiled and step == start and d.is_rank0:
            say(f"torch.compile: the first step took {time.perf_counter() - t_first:.1f} s, compilation included"
                " (`--set compile=false` turns it off)")
        steps_since += 1
        steps_unsaid += 1
        last = done == tcfg.steps
        logged = done % tcfg.log_every == 0 or last
        if logged:
            elapsed = time.perf_counter() - t_last
            recorder.record(done, train_loss=train_loss, lr=lr, grad_norm=float(grad_norm),
                            tokens_per_s=tokens_per_step * steps_since / elapsed,
                            peak_memory_bytes=peak_memory_bytes(d.device), train_flops=flops_per_step * done)
            t_last, steps_since = time.perf_counter(), 0
        verdict = None
        evaluated = done % tcfg.eval_every == 0 or last
        if d.is_rank0 and not evaluated:
            now = time.perf_counter()
            if step == start or now - t_said >= PRINT_EVERY_S:
                tok_s = tokens_per_step * steps_unsaid / max(now - t_said, 1e-9)
                say(f"step {done}/{tcfg.steps} train {train_loss:.4f} · {tok_s:,.0f} tok/s")
                t_said, steps_unsaid = now, 0
        if evaluated:
            evals = evaluate(model, eval_shards, cfg, d, autocast, raw_model.residual)
            recorder.record(done, **evals)
            ev = evals["eval_loss"]
            if d.is_rank0:
                say(f"step {done}/{tcfg.steps} train {train_loss:.4f} eval {ev:.4f}")
            verdict = recorder.verdict(done, ev)
            t_last = t_said = time.perf_counter()  # keep eval time out of tokens/s
            steps_unsaid = 0
        preempted, stop = agree([preemption.requested, verdict is not None], d)
        every = tcfg.checkpoint_every
        if (done % every == 0 if every else evaluated) or last or preempted:
            if d.is_rank0:
                t_save = time.perf_counter()
                try:
                    checkpoint.save(ckpt, raw_model, optimizer, done)
                    saved = done
                except checkpoint.NotSaved as exc:  # no room: the last saved one stands; a later save tries again
                    say(f"attnres: {exc}; training goes on, and a resume would continue from "
                        + (f"step {saved}, the last checkpoint saved" if saved else "step 0 (none saved yet)"),
                        err=True)
                saving = time.perf_counter() - t_save  # kept out of tokens/s, as eval time is
                t_last, t_said = t_last + saving, t_said + saving
        if logged or evaluated or preempted or stop:
            recorder.progress(done)
        if preempted:
            kept = "checkpoint saved" if saved == done else (f"no room for a checkpoint, the last is of step {saved}"
                                                           if saved else "no room for a checkpoint, none saved")
            return Ending(states.PREEMPTED, done, f"SIGTERM: {kept}; resumable (`attnres resume RUN`, "
                                                  "or launch the grid again)")
        if stop:
            return Ending(states.STOPPED, done, verdict)
    return Ending(states.FINISHED, tcfg.steps)
