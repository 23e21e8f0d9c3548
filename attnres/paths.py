"""Every location attnres reads or writes, and the environment variable that moves it.

One module, imported by everyone and importing nothing of attnres, so that a path is spelled once
and no two modules need each other to agree on where a run's files are.

=====================  =======================  ==============================================
what                   default                  environment variable
=====================  =======================  ==============================================
tracking database      ./runs.db (SQLite)       ATTNRES_DB (a file path or SQLAlchemy URL)
logs, spools, sbatch   ./logs                   ATTNRES_LOGS
checkpoints            ./checkpoints            ATTNRES_CHECKPOINTS
prepared datasets      ./data                   ATTNRES_DATA
compiled CPU kernels   ~/.cache/attnres         ATTNRES_CACHE
machine run slots      /tmp/attnres-slots-UID   ATTNRES_SLOTS (lock files every queue shares)
=====================  =======================  ==============================================
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DB = "runs.db"


def default_db() -> str:
    """``$ATTNRES_DB`` or ``./runs.db``."""
    return os.environ.get("ATTNRES_DB", DEFAULT_DB)


def logs_dir() -> Path:
    """``$ATTNRES_LOGS`` or ``./logs``: run logs, spools, sbatch scripts, queue logs."""
    return Path(os.environ.get("ATTNRES_LOGS", "logs"))


def run_log(run_id: int) -> Path:
    """A run's log (its torchrun output), absolute, as recorded in the run's row."""
    return (logs_dir() / f"run-{run_id}.log").resolve()


def spool_of(log: Path) -> Path:
    """A run's spool (the metric writer's write-ahead log) lives beside its log."""
    return Path(log).with_suffix(".spool.jsonl")


def spools() -> list[Path]:
    """Every non-empty spool under the logs folder (regular files only: a FIFO or folder so named is none)."""
    return sorted(p for p in logs_dir().glob("*.spool.jsonl") if p.is_file() and p.stat().st_size)


def queue_log(first_run: int) -> Path:
    """The output of a detached queue process, named after its first run."""
    return logs_dir() / f"queue-{first_run}.log"


def study_log(study_id: int) -> Path:
    """The output of a detached study (``attnres study --detach``)."""
    return logs_dir() / f"study-{study_id}.log"


def slots_dir() -> Path:
    """Lock files of this machine's run slots (one per GPU, or one for the CPU), shared by every queue
    process of this user: ``$ATTNRES_SLOTS`` or ``/tmp/attnres-slots-<uid>``."""
    return Path(os.environ.get("ATTNRES_SLOTS") or f"/tmp/attnres-slots-{os.getuid()}")  # noqa: S108


def checkpoints_dir(run_id: int) -> Path:
    """``$ATTNRES_CHECKPOINTS/run-ID`` (default ``./checkpoints/run-ID``)."""
    return Path(os.environ.get("ATTNRES_CHECKPOINTS", "checkpoints")) / f"run-{run_id}"


def data_root() -> Path:
    """Where named datasets live: ``$ATTNRES_DATA`` or ``./data``."""
    return Path(os.environ.get("ATTNRES_DATA", "data"))


def dataset(name: str) -> Path:
    """A dataset name ('builtin', or a folder under the data root) or a path to a folder."""
    p = Path(name)
    return p if (p.is_absolute() or len(p.parts) > 1) else data_root() / name


def kernel_cache() -> Path:
    """Compiled CPU kernels: ``$ATTNRES_CACHE/kernels`` (default ``~/.cache/attnres/kernels``)."""
    return Path(os.environ.get("ATTNRES_CACHE") or Path.home() / ".cache" / "attnres") / "kernels"
