"""Checkpoints: model, optimizer, step and RNG state, written atomically.

The data position needs no saving: the loader's batch is a function of (seed, step).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch


def save(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore state in place and return the step to continue from."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return int(state["step"])
