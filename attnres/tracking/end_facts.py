"""``--on-end CMD``: what the database says of a run's end, for the user's command (:mod:`attnres.on_end` runs it).

The lifecycle layer (:mod:`attnres.tracking.lifecycle`) calls :func:`run_ended` once a transition to an
end (finished, failed, killed, diverged, stopped) is recorded; a finished run found incomplete, or made
whole again, is not a second end. A transition is a compare-and-set, so exactly one process records a
run's end, whichever it is (the trainer, the queue, a monitor, ``attnres kill``, ``attnres sync``), and
that process runs the command, once.

Environment of the command: ``ATTNRES_RUN_ID``, ``ATTNRES_VARIANT``, ``ATTNRES_SEED``, ``ATTNRES_STATE``,
``ATTNRES_EXPERIMENT``, ``ATTNRES_PRESET``, ``ATTNRES_STEP``, ``ATTNRES_TOTAL_STEPS``, ``ATTNRES_LAST_EVAL``
and ``ATTNRES_LAST_EVAL_STEP`` (empty when the run has no eval), ``ATTNRES_MESSAGE`` (why it ended, if
recorded), ``ATTNRES_LOG`` (its log file), and the run's settings beyond its variant's defaults (a sweep's cell):
``ATTNRES_SETTINGS`` (``lr=0.001,warmup=10``, as ``attnres compare VARIANT@SETTINGS`` takes them) and one
``ATTNRES_SET_<KEY>`` each (``ATTNRES_SET_LR=0.001``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from attnres import on_end
from attnres.logline import say
from attnres.tracking.schema import Metric, MetricKey, Run


def facts(engine: Engine, run_id: int) -> tuple[list[str] | None, dict[str, str]]:
    """The run's command (None: it has none) and the environment variables that describe its end."""
    with engine.connect() as conn:
        run = conn.execute(select(Run.on_end_json, Run.variant, Run.seed, Run.status, Run.experiment, Run.preset,
                                  Run.step, Run.total_steps, Run.message, Run.log_path, Run.config_json,
                                  Run.launch_id)
                           .where(Run.id == run_id)).one_or_none()
        if run is None or not run.on_end_json:
            return None, {}
        siblings = conn.execute(select(Run.variant, Run.config_json).where(Run.launch_id == run.launch_id)).all() \
            if run.launch_id is not None else []
        key = select(MetricKey.id).where(MetricKey.name == "eval_loss").scalar_subquery()
        last = conn.execute(select(Metric.step, Metric.value).where(Metric.run_id == run_id, Metric.key_id == key)
                            .order_by(Metric.step.desc()).limit(1)).one_or_none()
    env = {"ATTNRES_RUN_ID": str(run_id), "ATTNRES_VARIANT": run.variant, "ATTNRES_SEED": str(run.seed),
           "ATTNRES_STATE": run.status, "ATTNRES_EXPERIMENT": run.experiment or "", "ATTNRES_PRESET": run.preset,
           "ATTNRES_STEP": str(run.step), "ATTNRES_TOTAL_STEPS": str(run.total_steps),
           "ATTNRES_LAST_EVAL": "" if last is None else repr(float(last.value)),
           "ATTNRES_LAST_EVAL_STEP": "" if last is None else str(last.step),
           "ATTNRES_MESSAGE": (run.message or "")[:2000], "ATTNRES_LOG": run.log_path or ""}
    own = cell(run.variant, run.preset, run.config_json, siblings)
    env["ATTNRES_SETTINGS"] = ",".join(f"{k}={v}" for k, v in own.items())
    env |= {f"ATTNRES_SET_{k.upper()}": v for k, v in own.items()}
    return json.loads(run.on_end_json), env


def cell(variant: str, preset: str, config_json: str | None,
         siblings: Sequence[tuple[str, str | None]] = ()) -> dict[str, str]:
    """The settings a run was launched with beyond its variant's defaults at its preset (its ``--set`` values),
    and every setting swept in its launch (``siblings``: (variant, config) of the launch's runs), by their
    ``--set`` names: a sweep's cell, even at a value that is the default."""
    from attnres.errors import AttnresError
    from attnres.run_settings import settings, swept_keys
    from attnres.variants.registry import default_settings

    mine = settings(config_json)
    swept = set(swept_keys((v, settings(c)) for v, c in siblings))
    try:
        default = default_settings(variant, preset)
    except (AttnresError, KeyError, ValueError, TypeError):
        default = mine
    return {k: v for k, v in mine.items() if k in swept or default.get(k) != v}


def run_ended(engine: Engine, run_id: int) -> None:
    """Start the run's ``--on-end`` command, if it has one; never raises (a failure is one warning)."""
    try:
        argv, env = facts(engine, run_id)
    except (SQLAlchemyError, ValueError, OSError) as exc:
        say(f"attnres: warning: run {run_id}'s --on-end command not run: {str(exc).splitlines()[0][:200]}",
            err=True)
        return
    if argv:
        on_end.start(run_id, argv, env)
