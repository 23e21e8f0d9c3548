"""Files a command writes at the user's request (``--out``, ``--plot``): one behaviour for every such option.

Missing folders are created, as ``export`` and ``data prepare`` always did (and ``mkdir -p``, MLflow's and
W&B's output folders do); but whether the path can be written is checked first, before any work, so a command
that cannot write its output says so in one line and has changed nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnres.errors import AttnresError


def _existing(folder: Path) -> Path:
    """The nearest folder of ``folder``'s ancestry (itself included) that exists."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check(path: Path, folder: bool = False) -> None:
    """Refuse, in one line, an output ``path`` that cannot be written: a folder in its place (a file where a
    folder is asked for, with ``folder``), a file where a folder must be created, or no permission."""
    path = Path(path).absolute()
    if folder and path.exists() and not path.is_dir():
        raise AttnresError(f"cannot write into '{path}': it is a file, not a folder")
    if not folder and path.is_dir():
        raise AttnresError(f"cannot write '{path}': it is a folder; give a file name")
    base = _existing(path if folder else path.parent)
    if not base.is_dir():
        raise AttnresError(f"cannot write '{path}': '{base}' is a file, not a folder")
    if not os.access(path if path.exists() else base, os.W_OK):
        raise AttnresError(f"cannot write '{path}': permission denied")


def prepare(path: Path, folder: bool = False) -> Path:
    """Create the folders ``path`` needs (``folder``: ``path`` itself too); returns ``path``."""
    (Path(path) if folder else Path(path).parent).mkdir(parents=True, exist_ok=True)
    return Path(path)
