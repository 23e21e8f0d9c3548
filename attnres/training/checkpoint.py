"""Checkpoints: model, optimizer, step and RNG state, written atomically, the previous one kept.

The data position needs no saving: the loader's batch is a function of (seed, step).

A checkpoint is written to a temporary file, flushed to disk (fsync) and renamed over ``last.pt``
only when complete; the checkpoint it replaces becomes ``prev.pt``. So a crash or a full disk
mid-write leaves the last good checkpoint in place, and a ``last.pt`` damaged later (a cut file)
still leaves ``prev.pt`` to continue from. Files are read with ``torch.load(weights_only=True)``:
only tensors and plain containers, never arbitrary pickled objects.
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import numpy as np
import torch

from attnres.errors import AttnresError
from attnres.logline import say

# a save the disk refused for want of room (full, over quota, past the process's file-size limit)
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

LAST, PREVIOUS = "last.pt", "prev.pt"
NAMES = (LAST, f"{PREVIOUS}.tmp", PREVIOUS)  # newest first: where a resume looks for a model to continue from


def _rng_state() -> dict:
    """Every RNG's state as tensors and plain values (what ``weights_only`` loading accepts)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, py_gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
            "python": [version, list(internal), py_gauss],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, py_gauss = state["python"]
    random.setstate((version, tuple(internal), py_gauss))
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class NotSaved(AttnresError):
    """The disk had no room for a checkpoint: the one saved before is still whole, and training can go on."""


def save(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> Path:
    """Write ``folder/last.pt`` atomically; the one it replaces is kept as ``prev.pt``.

    A disk with no room (full, a quota, a file-size limit) is :class:`NotSaved`, its partial file removed: the
    checkpoints already there are untouched, so the caller may go on training and save again later.

    A folder deleted before the save (a clean-up, a user's ``rm -rf checkpoints``) is made again; one deleted
    while the save writes into it (its files and renames then fail: FileNotFoundError) is made again and the
    save done once more: a run's training is not lost to a missing folder, only its older checkpoints are.
    """
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "rng": _rng_state()}
    try:
        try:
            return _write(folder, state)
        except FileNotFoundError:
            say(f"attnres: checkpoint folder {folder} was deleted during the save at step {step}; writing it again",
                err=True)
            return _write(folder, state)
    except (OSError, RuntimeError) as exc:  # (torch.save reports a failed write as a RuntimeError)
        code = _errno_of(exc)
        if code not in NO_ROOM:
            raise
        try:
            (folder / f"{LAST}.tmp").unlink(missing_ok=True)
        except OSError:
            pass
        raise NotSaved(f"checkpoint of step {step} not saved ({os.strerror(code)})") from None


def _errno_of(exc: BaseException | None) -> int | None:
    """The errno of the OSError behind ``exc``: torch.save raises a RuntimeError whose context is the file's error."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc.errno
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _write(folder: Path, state: dict) -> Path:
    """One try of :func:`save`: ``state`` to a temporary file, renamed over ``last.pt``, the old one kept."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{LAST}.tmp"
    with tmp.open("wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    last, kept = folder / LAST, folder / f"{PREVIOUS}.tmp"
    if last.exists():  # keep it as prev.pt without a moment when there is no last.pt (a kill may come any time)
        kept.unlink(missing_ok=True)
        try:
            os.link(last, kept)  # a second name for last.pt's file; prev.pt is untouched until last.pt is new
        except OSError:  # a file system without hard links: move it (a kill here leaves prev.pt and the .tmp)
            os.replace(last, kept)
    # last.pt is replaced before prev.pt: at no moment are the two names one file, so damage done to
    # last.pt in place (a cut or overwritten file) can never reach prev.pt too
    os.replace(tmp, last)
    if kept.exists():
        os.replace(kept, folder / PREVIOUS)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the renames themselves reach the disk
    finally:
        os.close(dir_fd)
    return last


def exists(folder: Path) -> bool:
    return any((folder / name).exists() for name in NAMES)


def step_of(folder: Path) -> int | None:
    """The step the newest readable checkpoint in ``folder`` continues from (None: none there), read without
    restoring it (memory-mapped), so that `attnres resume` can say where each run continues."""
    for name in NAMES:
        path = folder / name
        if not path.exists():
            continue
        for mmap in (True, False):  # (a file system without mmap: read as the trainer reads it)
            try:
                return int(torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)["step"])
            except Exception:  # noqa: BLE001, S112 - unreadable: the trainer falls back to the previous one too
                continue
    return None


def load(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore the newest readable checkpoint in place and return the step to continue from.

    A ``last.pt`` that cannot be read falls back to ``prev.pt``, with one line saying so; when
    neither can be read it is one clear error (``attnres resume --restart`` starts the run over).
    """
    errors = []
    for name in NAMES:  # (the .tmp: the one before last.pt, if a save was cut short)
        path = folder / name
        if not path.exists():
            continue
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            _set_rng_state(state["rng"])
        except Exception as exc:  # noqa: BLE001 - a cut, garbled or foreign file: try the previous one
            errors.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            continue
        if errors:
            say(f"attnres: checkpoint {errors[0]} is unreadable; continuing from {name} (step {state['step']})",
                err=True)
        return int(state["step"])
    raise AttnresError(f"no readable checkpoint in {folder} ({'; '.join(errors) or 'none there'}): "
                       "`attnres resume --restart RUN` starts the run over")
