"""``--on-end CMD``: the user's command, run when a run ends, with the run's facts in its environment.

The lifecycle layer (:mod:`attnres.tracking.lifecycle`) calls :func:`run_ended` once a transition to an
end (finished, failed, killed, diverged, stopped) is recorded; a finished run found incomplete, or made
whole again, is not a second end. A transition is a compare-and-set, so exactly one process records a
run's end, whichever it is (the trainer, the queue, a monitor, ``attnres kill``, ``attnres sync``), and
that process runs the command, once. It is an argument list, never given to a shell; it starts at once
and is waited for on a thread, so no writer waits on it. A command that cannot start, fails or outlives
``ATTNRES_ON_END_TIMEOUT`` seconds (default 300: it is then stopped, with its children) costs one warning
line and changes nothing recorded. A process about to leave (the trainer, a command-line verb) waits for
its commands 30 s at most, then leaves them running unwatched. The command gets the recording process's
environment without torchrun's rank variables.

Environment of the command: ``ATTNRES_RUN_ID``, ``ATTNRES_VARIANT``, ``ATTNRES_SEED``, ``ATTNRES_STATE``,
``ATTNRES_EXPERIMENT``, ``ATTNRES_PRESET``, ``ATTNRES_STEP``, ``ATTNRES_TOTAL_STEPS``, ``ATTNRES_LAST_EVAL``
and ``ATTNRES_LAST_EVAL_STEP`` (empty when the run has no eval), ``ATTNRES_MESSAGE`` (why it ended, if
recorded), ``ATTNRES_LOG`` (its log file), and the run's settings beyond its variant's defaults (a sweep's cell):
``ATTNRES_SETTINGS`` (``lr=0.001,warmup=10``, as ``attnres compare VARIANT@SETTINGS`` takes them) and one
``ATTNRES_SET_<KEY>`` each (``ATTNRES_SET_LR=0.001``).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from attnres.durations import env_seconds
from attnres.logline import say
from attnres.tracking.schema import Metric, MetricKey, Run

_waiting: list[threading.Thread] = []
_lock = threading.Lock()


def timeout_s() -> float:
    return env_seconds("ATTNRES_ON_END_TIMEOUT", 300.0)


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


#: what torchrun gives its workers: not the command's business (it is no rank of the run)
_TORCHRUN = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                       "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})


def _environment(facts_: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k not in _TORCHRUN and not k.startswith("TORCHELASTIC_")}
    return {**keep, **facts_}


def run_ended(engine: Engine, run_id: int) -> None:
    """Start the run's ``--on-end`` command, if it has one; never raises (a failure is one warning)."""
    try:
        argv, env = facts(engine, run_id)
    except (SQLAlchemyError, ValueError, OSError) as exc:
        say(f"attnres: warning: run {run_id}'s --on-end command not run: {str(exc).splitlines()[0][:200]}",
            err=True)
        return
    if not argv:
        return
    try:
        proc = subprocess.Popen(list(argv), env=_environment(env), stdin=subprocess.DEVNULL,
                                start_new_session=True)  # (a Ctrl-C or kill of our group is not its end)
    except (OSError, ValueError) as exc:
        say(f"attnres: warning: run {run_id}'s --on-end command {argv[0]!r} could not start: {exc}", err=True)
        return
    waiter = threading.Thread(target=_wait, args=(proc, run_id, argv), name="attnres-on-end", daemon=True)
    with _lock:
        if not _waiting:
            atexit.register(wait)  # a command-line verb does not leave before its commands are done
        _waiting.append(waiter)
    waiter.start()


def _wait(proc: subprocess.Popen, run_id: int, argv: Sequence[str]) -> None:
    try:
        code = proc.wait(timeout_s())
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its session: a script's children too
        except OSError:
            proc.kill()
        proc.wait()
        say(f"attnres: warning: run {run_id}'s --on-end command {argv[0]!r} ran past {timeout_s():g} s "
            "(ATTNRES_ON_END_TIMEOUT) and was stopped", err=True)
        return
    if code != 0:
        say(f"attnres: warning: run {run_id}'s --on-end command {argv[0]!r} exited with {code}", err=True)


LEAVING_WAIT_S = 30.0  # how long a process about to leave (a trainer holding its GPU, a command) waits for them


def wait(timeout: float = LEAVING_WAIT_S) -> None:
    """Wait for the commands this process started, up to ``timeout`` (a process about to leave calls it).

    A command still going then is left running in its own session, unwatched (one line says so): the
    trainer's GPU and the queue's slot are not held for a slow notification.
    """
    deadline = time.monotonic() + min(timeout, timeout_s() + 5)
    with _lock:
        waiting = list(_waiting)
    for waiter in waiting:
        waiter.join(max(0.0, deadline - time.monotonic()))
    with _lock:
        left = [w for w in _waiting if w.is_alive()]
        _waiting.clear()  # (given up on: not waited for again when the process leaves)
    if left:
        say(f"attnres: {len(left)} --on-end command(s) still running after {timeout:g} s: left running, "
            "their exit not watched", err=True)
