"""What this machine offers runs: its GPUs (without importing torch on a machine that has none) and its cores."""

from __future__ import annotations

import os
from pathlib import Path


def gpu_driver_loaded() -> bool:
    """Whether an NVIDIA or AMD GPU driver is loaded here: without one there is no GPU to count, and
    asking torch would cost the queue a 2-3 s import on every launch of a CPU machine."""
    return Path("/proc/driver/nvidia").exists() or Path("/dev/kfd").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def visible_gpus() -> list[str]:
    """This machine's GPUs as the ids CUDA_VISIBLE_DEVICES takes (honouring one already set)."""
    if not gpu_driver_loaded():
        return []
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA means CPU scheduling
        n = 0
    given = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return given[:n] if given else [str(i) for i in range(n)]


def threads_per_process(nproc: int, runs_at_once: int = 1) -> int:
    """Compute threads for each of a run's ``nproc`` processes when ``runs_at_once`` runs share the machine's
    usable cores (its CPU affinity): together they fill the cores without oversubscribing them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, nproc * runs_at_once))
