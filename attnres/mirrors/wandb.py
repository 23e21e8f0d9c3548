"""The Weights & Biases mirror: one attnres run as one W&B run whose id comes from the run's identity.

``wandb.init(reinit="create_new")`` gives each adapter its own run object, so the mirror works beside the user's own
W&B run in the same process; it still sets the module-global ``wandb.run`` to the latest run, as W&B always does.
``console="off"`` keeps W&B from wrapping the process's stdout/stderr (it would capture attnres's own output), and
``silent`` keeps its banner away. The mode (online / offline) and folder come from the environment (``WANDB_MODE``,
``WANDB_DIR``), read by W&B once per process, at its first run: later changes are ignored (W&B warns). The first
run also starts W&B's ``wandb-core`` helper process, which lives until the process exits.

``import wandb`` below is an absolute import (Python 3): it is the installed package, never this module.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import wandb

from attnres.mirrors import OK_STATUSES, RunInfo, Target, merge_steps
from attnres.tracking import states

MAX_ID = 64


def run_id(identity: str) -> str:
    """The W&B run id for ``identity``: only ``[A-Za-z0-9_-]``, stable, and still unique when characters were
    replaced or it was shortened (a hash of the identity is appended then)."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "-", identity)
    if clean != identity or len(clean) > MAX_ID:
        digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
        clean = f"{clean[:MAX_ID - 9]}-{digest}"
    return clean


class WandbMirror:
    """Mirrors a run to W&B: project ``target.where``, else ``WANDB_PROJECT``, else ``run.experiment``.

    W&B drops (with a warning) a step lower than one already logged, so the adapter skips those itself; a row at the
    step just sent is still accepted, W&B joins it to that step's row.
    """

    buffered = True  # W&B hands points to its own process; finish() waits for it

    def __init__(self, target: Target) -> None:
        self.target = target
        self._run: Any = None
        self._last_step: int | None = None

    def open(self, run: RunInfo) -> None:
        """Start the W&B run with id from ``run.identity`` or continue it (``resume="allow"``)."""
        self._run = wandb.init(
            project=self.target.where or os.environ.get("WANDB_PROJECT") or run.experiment,
            id=run_id(run.identity),
            name=run.name,
            config={**run.params, **run.tags},
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),
        )
        # a continued online run starts after its last step: anything below that W&B would drop
        starting = int(self._run.starting_step or 0)
        self._last_step = starting if starting > 0 else None

    def log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Send one ``run.log`` per step (consecutive rows of a step joined); steps that went back are skipped."""
        run = self._opened()
        for step, values in merge_steps(rows):
            if self._last_step is not None and step < self._last_step:
                continue
            run.log({key: float(value) for key, value in values.items()}, step=int(step))
            self._last_step = step

    def end(self, status: str) -> None:
        """Record attnres's ``status`` in the summary and finish the run: exit code 0 when it ended as intended.

        A preempted run is marked preempting first, so W&B shows it as preempted (to be resumed), not crashed.
        """
        run = self._opened()
        run.summary["attnres_status"] = status
        if status == states.PREEMPTED:
            run.mark_preempting()
        run.finish(exit_code=0 if status in OK_STATUSES else 1)

    def _opened(self) -> Any:
        """The W&B run, or an error if :meth:`open` has not run (a bug in the caller)."""
        if self._run is None:
            raise RuntimeError("WandbMirror.open() was not called")
        return self._run
