"""Mirrors: send one attnres run (its config, tags and metric points) to an external tracker as well.

attnres keeps every run in its own database; a mirror copies a run to MLflow, trackio or Weights & Biases so it can
be seen next to other work there. A target is written ``kind`` or ``kind=WHERE`` (``--mirror`` and the
``ATTNRES_MIRROR`` environment variable), parsed here; the adapters live in one module per tracker and are imported
only by :func:`make`, because the trackers are optional packages that take seconds to import.

Every adapter follows :class:`Mirror`: ``open`` creates the remote run or continues the one with the same
:attr:`RunInfo.identity` (so sending a run again, or after a resume, never makes a second copy), ``log`` sends rows
in batches, ``end`` marks the remote run with attnres's final status and flushes. All three may be called from a
thread that is not the main thread. Errors inside an adapter are ordinary exceptions for the caller to turn into one
warning; only a missing package is :class:`MirrorUnavailable`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from attnres.errors import AttnresError
from attnres.tracking import states

KINDS = ("mlflow", "trackio", "wandb")
CHOICES = "mlflow[=URI], trackio[=PROJECT] or wandb[=PROJECT]"
# attnres's final words for a run; the first three mean it ended as intended (a diverged run ended on purpose: its
# loss went non-finite and attnres stopped it), so trackers that know "finished" vs "failed" say finished for them
OK_STATUSES = (states.FINISHED, states.DIVERGED, states.STOPPED)
# the tag (MLflow) that finds a run again; W&B finds it by its id, trackio by its name
IDENTITY_TAG = "attnres.identity"

REGISTRY: dict[str, str] = {
    "mlflow": "attnres.mirrors.mlflow:MlflowMirror",
    "trackio": "attnres.mirrors.trackio:TrackioMirror",
    "wandb": "attnres.mirrors.wandb:WandbMirror",
}


@dataclass(frozen=True)
class Target:
    """Where a run is mirrored: a tracker kind and, optionally, where in it (``None``: the tracker's default).

    ``where`` is the tracking URI for MLflow and the project name for trackio and W&B.
    """

    kind: str
    where: str | None

    def spec(self) -> str:
        """The text form, ``kind`` or ``kind=WHERE``; :func:`parse` reads it back to an equal Target."""
        return self.kind if self.where is None else f"{self.kind}={self.where}"


def _bad(spec: str) -> AttnresError:
    """The one-line error for a spec that names no known tracker (``!r`` keeps even a newline on one line)."""
    return AttnresError(f"bad --mirror {spec!r}: choose {CHOICES}")


def parse(spec: str) -> Target:
    """Read one target, ``kind`` or ``kind=WHERE``; the kind is matched case-insensitively, spaces around are ignored.

    Only the first ``=`` splits, so an MLflow URI may itself contain ``=`` (a query string).
    """
    kind, sep, where = spec.strip().partition("=")
    kind, where = kind.strip().lower(), where.strip()
    if kind not in KINDS or (sep and not where):
        raise _bad(spec)
    return Target(kind, _absolute(where) if kind == "mlflow" and sep else where if sep else None)


def _absolute(uri: str) -> str:
    """An MLflow store on this machine named by a relative path, made absolute where it is given: the trainer,
    a SLURM job or a later `attnres sync` may run elsewhere, and the same store must have one spec."""
    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme) and not uri[len(scheme):].startswith("/"):
            return scheme + str(Path(uri[len(scheme):]).resolve())
    if "://" not in uri and ":" not in uri.split("/")[0] and ("/" in uri or uri.startswith(".")):
        return str(Path(uri).resolve())  # a folder path (MLflow's file store); a bare word is a name (databricks)
    return uri


def parse_many(text_or_specs: str | list[str]) -> list[Target]:
    """Read several targets: a list of specs (one each), or one string of specs split by commas and/or whitespace.

    The string form is ``ATTNRES_MIRROR``'s (``"mlflow, wandb=proj"``). List items are not split: an option given
    once per target may carry a URI with a comma in it. ``"none"`` alone (or nothing) means no mirror; the same
    spec twice is kept once, in first-seen order.
    """
    if isinstance(text_or_specs, str):
        items = [s for s in re.split(r"[,\s]+", text_or_specs.strip()) if s]
    else:
        items = [s for s in text_or_specs if s.strip()]
    if len(items) == 1 and items[0].strip().lower() == "none":
        return []
    targets: dict[str, Target] = {}
    for item in items:
        target = parse(item)
        targets.setdefault(target.spec(), target)
    return list(targets.values())


def specs(text_or_specs: str | list[str]) -> list[str]:
    """:func:`parse_many`'s targets in their text form (what a run and the database keep)."""
    return [t.spec() for t in parse_many(text_or_specs)]


@dataclass(frozen=True)
class RunInfo:
    """What a tracker is told about a run when it is opened.

    ``identity`` is stable and unique across attnres databases (e.g. ``"7-3fa9c2d1"``): the same attnres run always
    maps to the same remote run, however often it is sent. ``experiment`` is the default MLflow experiment, trackio
    project and W&B project. ``params`` is the flattened config; ``tags`` are attnres's own facts about the run.
    """

    run_id: int
    identity: str
    name: str
    experiment: str
    params: dict[str, str]
    tags: dict[str, str]


class MirrorUnavailable(AttnresError):
    """A tracker's package is not installed; ``str()`` is one line with the ``pip install`` that fixes it."""

    def __init__(self, kind: str, missing: str | None = None) -> None:
        self.kind = kind
        self.missing = missing or kind
        super().__init__(f"the {kind} mirror needs the {self.missing} package: pip install attnres[{kind}]")


@runtime_checkable
class Mirror(Protocol):
    """One tracker's adapter for one run: ``open`` once, ``log`` any number of times, ``end`` once."""

    target: Target
    #: True when ``log`` may return before the tracker holds the points (they are then sure only after ``end``)
    buffered: bool

    def open(self, run: RunInfo) -> None:
        """Create the remote run, or find and continue the one with ``run.identity``; send params and tags."""

    def log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Send ``(step, {key: value})`` rows, in the order they were logged, in as few calls as the tracker allows."""

    def end(self, status: str) -> None:
        """Mark the remote run with attnres's final ``status`` where the tracker has such a notion; flush it."""


def make(target: Target) -> Mirror:
    """The adapter for ``target``, imported only now; a missing tracker package raises :class:`MirrorUnavailable`.

    An ImportError from inside attnres itself is a bug, not a missing package, and propagates unchanged.
    """
    if target.kind not in REGISTRY:
        raise _bad(target.spec())
    module_name, _, class_name = REGISTRY[target.kind].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        missing = e.name or target.kind
        if missing == "attnres" or missing.startswith("attnres."):
            raise
        raise MirrorUnavailable(target.kind, missing.partition(".")[0]) from e
    return getattr(module, class_name)(target)


def merge_steps(rows: Iterable[tuple[int, dict[str, float]]]) -> list[tuple[int, dict[str, float]]]:
    """Join rows of the same step that come one after another (a train row and that step's eval row) into one.

    Trackers that store a row per call (trackio, W&B) then keep one row per step. A key given twice at one step
    keeps its later value.
    """
    merged: list[tuple[int, dict[str, float]]] = []
    for step, values in rows:
        if merged and merged[-1][0] == step:
            merged[-1][1].update(values)
        else:
            merged.append((step, dict(values)))
    return merged
