"""The trackio mirror: one attnres run as one trackio run, named so that the same attnres run finds it again.

trackio keeps its current run and project in context variables and calls ``finish()`` on the previous run when
``trackio.init`` is called again in the same context. Each adapter therefore runs ``init`` and ``finish`` inside its
own :class:`contextvars.Context`: it never finishes a run of the caller's (or of another adapter), and the caller's
``trackio.log`` is not redirected to the mirror's run. (Three adapters logging at once from three threads, to one
project, kept every point apart; trackio itself is built around one current run per process, and its exit hook
only finishes the main context's run, so always call :meth:`TrackioMirror.end`: it is what flushes.)

Know before use:

* trackio reads ``TRACKIO_DIR`` (its local store) once, when it is first imported: set it before the first mirror.
* trackio prints a few lines to stdout on ``init`` and ``finish``; it has no quiet switch.
* trackio reports its own write errors as warnings (``warnings.warn``) rather than raising them.
* a continued run's config is replaced by the new one (the same run id gives the same params, so nothing is lost).

``import trackio`` below is an absolute import (Python 3): it is the installed package, never this module.
"""

from __future__ import annotations

import contextvars
from typing import Any

import trackio

from attnres.mirrors import RunInfo, Target, merge_steps


class TrackioMirror:
    """Mirrors a run to trackio: project ``target.where`` (default ``run.experiment``), run ``name [identity]``.

    trackio finds a run again by name, so the name carries the identity; ``resume="allow"`` continues it.
    """

    buffered = True  # trackio writes from a buffer of its own; finish() flushes it

    def __init__(self, target: Target) -> None:
        self.target = target
        self._context = contextvars.Context()
        self._run: Any = None

    def open(self, run: RunInfo) -> None:
        """Start (or continue) the trackio run; config is the params plus attnres's tags.

        trackio's own CPU/GPU sampling is off: the mirror may send a run long after it ran, on another machine.
        """
        self._run = self._context.run(
            trackio.init,
            project=self.target.where or run.experiment,
            name=f"{run.name} [{run.identity}]",
            config={**run.params, **run.tags},
            resume="allow",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Send one trackio row per step (consecutive rows of a step are joined); trackio batches the writes."""
        run = self._opened()
        for step, values in merge_steps(rows):
            run.log({key: float(value) for key, value in values.items()}, step=int(step))

    def end(self, status: str) -> None:
        """Flush and close the trackio run (it waits for its writer). trackio has no run status to set."""
        run = self._opened()
        self._context.run(run.finish)

    def _opened(self) -> Any:
        """The trackio run, or an error if :meth:`open` has not run (a bug in the caller)."""
        if self._run is None:
            raise RuntimeError("TrackioMirror.open() was not called")
        return self._run
