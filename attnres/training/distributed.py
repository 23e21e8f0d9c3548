"""The ranks of one run: joining torchrun's process group, and agreeing across ranks."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    """This process's place in the run: rank, world size, local rank and device."""

    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_rank0(self) -> bool:
        """Rank 0 owns the run's bookkeeping (database row, metrics, checkpoints)."""
        return self.rank == 0

    def describe(self) -> str:
        """What trains the run, for the report's provenance: e.g. ``NVIDIA H200 x 8`` or ``cpu x 1``."""
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.device.type
        return f"{name} x {self.world}"


def device_model(device: torch.device) -> str:
    """The device's model name, which its speed depends on: the GPU's, or the CPU's from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return "cpu: " + " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    import platform

    return "cpu: " + (platform.processor() or platform.machine() or "unknown")


def die_with_parent() -> None:
    """Under torchrun, end this worker when its torchrun agent dies, however it dies (Linux).

    Killed by SIGKILL, the agent cannot stop its workers; an orphaned worker would train on and
    write its end over the run's recorded failure. PR_SET_PDEATHSIG has the kernel send the worker
    SIGKILL when its parent goes, so the run's processes end together.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the agent died before the line above: do not outlive it
        os.kill(os.getpid(), signal.SIGKILL)


def setup() -> Dist:
    """Join the process group torchrun set up (gloo on CPU, nccl on GPU); single process otherwise."""
    die_with_parent()
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


def teardown(d: Dist) -> None:
    if d.world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def single(device: str = "cpu") -> Dist:
    """One process, no process group: in-process training (tests, notebooks)."""
    return Dist(0, 1, 0, torch.device(device))


def all_mean(value: torch.Tensor, d: Dist) -> float:
    """The mean of a scalar over ranks."""
    if d.world > 1:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= d.world
    return float(value)


def agree(flags: list[bool], d: Dist) -> list[bool]:
    """Each flag set on any rank is set on all: every rank must stop at the same step."""
    t = torch.tensor([float(f) for f in flags], device=d.device)
    if d.world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(x) for x in t.tolist()]


def sum_over_ranks(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world > 1:
        dist.all_reduce(t)
    return t
