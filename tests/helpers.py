"""Helpers the tests share: run settings, the CLI (in this process or as a real one), and reading what runs
recorded. Fixtures stay in conftest.py; test modules import these with ``from helpers import ...`` (``tests/`` is
on ``sys.path``: ``pythonpath`` in pyproject.toml's [tool.pytest.ini_options])."""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import io
import logging
import multiprocessing.process
import os
import sqlite3
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "attnres.cli.main"]  # the real command, as its own process

# Small, fast runs of the GPT-2 vocabulary (a user's default path): a narrow model, few tokens per step.
FAST_GPT2 = ["--set", "batch_size=4", "--set", "eval_batches=2", "--set", "eval_every=10",
             "--set", "log_every=2", "--set", "warmup=2", "--set", "n_layer=2", "--set", "d_model=32",
             "--set", "n_head=2", "--set", "seq_len=32"]
# The same on the built-in corpus as UTF-8 bytes (257 ids): a step is then the layers', not a 50257-wide
# output layer's, several times faster.
BYTES = ["--data", "builtin-bytes", "--set", "vocab_size=320"]
FAST = [*FAST_GPT2, *BYTES]
# Runs trained in the test's own process (the inline backend: no torchrun, no trainer interpreter, 5-6 s less a
# run on this machine): for tests whose subject is what runs record, not the processes that train them. An inline
# run records the same curves and conditions as the same run under torchrun (test_inline).
INLINE = ["--backend", "inline"]
# Steps of a run that a test ends by a kill or a signal: it cannot finish first, however fast the machine.
LONG = "100000"


# The issue's tiny run: 150 steps, every step logged (5 values a step) and evals every 25 steps.
# The issue's run: 150 steps with the fault at step 50 (ATTNRES_FAULT_STEPS changes the length; the
# fault must still find the run going, so not much shorter).
ISSUE_STEPS = int(os.environ.get("ATTNRES_FAULT_STEPS", "150"))
ISSUE_MID = ISSUE_STEPS // 3


def issue_run(steps: int = ISSUE_STEPS) -> list[str]:
    """The issue's tiny run at ``steps`` steps: every step logged, an eval every 25 steps."""
    return ["--set", "n_layer=1", "--set", "d_model=32", "--set", "n_head=2", "--set", "batch_size=2",
            "--set", "seq_len=32", "--steps", str(steps), "--set", "log_every=1", "--set", "eval_batches=1"]


ISSUE_RUN = issue_run()
# train_loss, lr, grad_norm, tokens_per_s, peak_memory_bytes, train_flops each step; eval at 0, 25, ..., the last step
ISSUE_ROWS = ISSUE_STEPS * 6 + len(set(range(0, ISSUE_STEPS + 1, 25)) | {ISSUE_STEPS})


# -- the CLI: in this process, or the real command -------------------------------------------------
# warnings a plain interpreter does not print (its default filters)
_HIDDEN_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def cli_here(*args: object, check: bool = False, timeout: float = 600,
             columns: int = 200) -> subprocess.CompletedProcess:
    """The CLI's entry point called in the test's process, giving what :func:`attnres` gives (arguments, exit code,
    stdout, stderr; ``columns`` wide, no colour). No interpreter starts and nothing is imported again: a report
    takes ~0.2 s here and 3-4 s as its own process, most of it importing torch, pandas and scipy. For every verb
    whose own process is not the subject (a kill or resume here still signals or starts the run's own processes;
    a launch with :data:`INLINE` trains in this process); a test of the installed command, of output to a pipe,
    of commands racing each other, of a signal to the verb itself, or of what a fresh interpreter prints uses
    :func:`attnres`.

    As a process's end would, the call waits for the ``--on-end`` commands it started and closes the databases
    it opened. Its warnings (those a plain interpreter shows) and log records go to its stderr. A
    call still going after ``timeout`` seconds ends the test's worker with every thread's traceback (the
    real command's timeout fails the test alone). ``args`` may hold paths and numbers: each is passed as its
    ``str``."""
    from attnres.tracking.run_store import RunStore

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    # (left in the reverse order: the output first, then the process's settings)
    with pytest.MonkeyPatch.context() as settings, contextlib.ExitStack() as leaving:
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.__stderr__)
        leaving.callback(faulthandler.cancel_dump_traceback_later)
        settings.setenv("COLUMNS", str(columns))  # (before the first import of the CLI: its consoles read it then)
        from attnres.cli.app import console
        from attnres.cli.app import err as err_console
        from attnres.cli.main import main

        for c in (console, err_console):  # as the real command writes to a pipe: its columns, no colour codes
            settings.setattr(c, "_width", columns)
            settings.setattr(c, "_color_system", None)
        settings.setattr(sys, "argv", ["attnres", *argv])
        leaving.callback(RunStore.forget_all)  # a process's end closes its databases
        log, root = logging.StreamHandler(err), logging.getLogger()
        log.setLevel(logging.WARNING)
        root.addHandler(log)
        leaving.callback(root.removeHandler, log)
        caught = leaving.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("default")
        leaving.enter_context(contextlib.redirect_stdout(out))
        leaving.enter_context(contextlib.redirect_stderr(err))
        try:
            main()
        except SystemExit as done:
            code = done.code
        except BaseException as exc:
            exc.add_note(f"attnres {' '.join(argv)} (in this process) wrote:\n{out.getvalue()}\n{err.getvalue()}")
            raise
        finally:
            if "attnres.on_end" in sys.modules:  # a verb does not leave before its --on-end commands end
                sys.modules["attnres.on_end"].wait()
            err.writelines(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
                           for w in caught if not issubclass(w.category, _HIDDEN_WARNINGS))
    if isinstance(code, str):  # as the interpreter does with sys.exit("message")
        err.write(code + "\n")
    returncode = (code & 0xFF) if isinstance(code, int) else (0 if code is None else 1)
    return _checked(subprocess.CompletedProcess(["attnres", *argv], returncode, out.getvalue(), err.getvalue()),
                    argv, check)


def _checked(proc: subprocess.CompletedProcess, args: Iterable[object], check: bool) -> subprocess.CompletedProcess:
    """``proc``, or (``check``) an AssertionError with its output when `attnres ARGS` failed."""
    if check and proc.returncode != 0:
        raise AssertionError(f"attnres {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n"
                             f"{proc.stderr}")
    return proc


def in_process(args: Iterable[object], capsys: pytest.CaptureFixture,
               monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """:func:`cli_here` as a tuple: its exit code, stdout and stderr (``capsys`` and ``monkeypatch``: the
    fixtures of the tests that call it, no longer needed)."""
    proc = cli_here(*args)
    return proc.returncode, proc.stdout, proc.stderr


def attnres(*args: str, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would (a test calling it is marked ``integration``)."""
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ | {"COLUMNS": "200"}, cwd=os.getcwd())
    return _checked(proc, args, check)


def queue_pid(stdout: str) -> int:
    """The pid of the background queue that `attnres launch --detach` reports."""
    return int(stdout.split("(pid ")[1].split(")")[0])


def stop_leftovers(db: Path) -> None:
    """Kill runs a test left queued or running, so no orphan slows the tests after it."""
    if not db.exists():
        return
    from attnres.runs import orchestrator
    from attnres.tracking.run_store import RunStore

    try:
        store = RunStore(str(db), create=False)
        try:
            orchestrator.kill(store, None)
        finally:
            store.close()
    except Exception:  # noqa: BLE001 - a test may leave a corrupt or locked file on purpose
        pass


# -- files a test writes ---------------------------------------------------------------------------
def sha(path: Path) -> str:
    """The SHA-256 of a file's bytes (to show a command left it byte-identical)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def arms_csv(folder: Path, arms: dict[str, dict[int, float]], experiment: str | None = None,
             name: str = "runs.csv", steps: Iterable[int] = (0, 50, 100)) -> Path:
    """A CSV in the import schema (``folder / name``): each variant's seeds, finished, with an eval curve from 10
    at step 0 down to the given final value at step 100, at ``steps``; in ``experiment`` when one is named."""
    import pandas as pd

    rows = [(v, seed, step, "eval_loss", 10 + (final - 10) * step / 100, "finished")
            for v, seeds in arms.items() for seed, final in seeds.items() for step in steps]
    frame = pd.DataFrame(rows, columns=["variant", "seed", "step", "key", "value", "status"])
    if experiment:
        frame["experiment"] = experiment
    path = folder / name
    frame.to_csv(path, index=False)
    return path


def database_at(db: Path, revision: str, preset: str = "tiny") -> None:
    """A SQLite file at an older schema ``revision`` holding one finished run (of ``preset``)."""
    from alembic import command
    from sqlalchemy import create_engine

    from attnres.tracking.db import _alembic

    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        command.upgrade(_alembic(conn), revision)
        conn.exec_driver_sql(
            "insert into runs (variant, seed, preset, data, config_json, config_hash, status, total_steps, step, "
            f"created_at, world_size) values ('standard', 7, '{preset}', 'builtin', '{{}}', 'x', 'finished', 10, 10, "
            "'2026-01-01 00:00:00', 1)")
    engine.dispose()


# -- reading what the real processes recorded, and waiting for it ----------------------------------
def runs(workdir: Path, db: str = "runs.db") -> list[dict]:
    """Every run row of the test's SQLite file, oldest first ([] before the launcher made it)."""
    if not (workdir / db).exists():
        return []
    try:
        with sqlite3.connect(f"file:{workdir / db}?mode=ro", uri=True) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute("select * from runs order by id")]
    except sqlite3.OperationalError:  # the schema is not there yet
        return []


def metric_rows(db: Path, run_id: int | None = 1) -> int:
    """How many metric rows run ``run_id`` has (every run's with None), read-only; 0 while the file or its
    schema is not there."""
    where, params = ("where run_id = ?", (run_id,)) if run_id is not None else ("", ())
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute(f"select count(*) from metrics {where}", params).fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def curve(workdir: Path, run_id: int, key: str, db: str = "runs.db") -> dict[int, float]:
    """One metric of one run: {step: value}."""
    with sqlite3.connect(workdir / db) as conn:
        return dict(conn.execute("select m.step, m.value from metrics m join metric_keys k on k.id = m.key_id "
                                 "where k.name = ? and m.run_id = ?", (key, run_id)).fetchall())


def values(engine, run_id: int, key: str) -> dict[int, float]:
    """One metric of one run as the store reads it (``engine``: the database's SQLAlchemy engine): {step: value}."""
    from attnres.tracking import run_rows

    frame = run_rows.metrics_frame(engine, [key], [run_id])
    return dict(zip(frame["step"], frame["value"], strict=True))


def train_steps(db: Path, run_id: int = 1) -> list[int]:
    """The steps at which a run logged train loss, in order ([] while the schema is not there)."""
    try:
        with sqlite3.connect(db) as conn:
            return [s for (s,) in conn.execute(
                "select m.step from metrics m join metric_keys k on k.id = m.key_id "
                "where k.name = 'train_loss' and m.run_id = ? order by m.step", (run_id,))]
    except sqlite3.OperationalError:
        return []


def wait_for(predicate, timeout: float = 240, every: float = 0.1):
    """Poll ``predicate`` until it returns something true (returned), or fail after ``timeout`` s.

    The limits are generous on purpose: a loaded machine is slow, and only the condition decides.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {getattr(predicate, '__name__', 'a condition')}")


# -- which tests start processes -------------------------------------------------------------------
# Programs that the library, or a library it uses, runs for itself and waits on for milliseconds, whatever the test:
# the C kernel's one-time build (then cached on disk; the compiler is $CC when set), `git rev-parse` for the code
# version, `uname -p` for platform.processor(). Not what the ``integration`` marker is about (trainers, torchrun,
# the CLI, services): they are not counted.
QUICK_TOOLS = {"git", "uname", "cc", "gcc", "clang"}


def _quick(program: str) -> bool:
    name = os.path.basename(program)
    return name in QUICK_TOOLS or name == os.path.basename(os.environ.get("CC", "") or "cc")


@contextlib.contextmanager
def processes_started() -> Iterator[list[str]]:
    """Record, while the block runs, every process started through :class:`subprocess.Popen` (``subprocess.run``
    and friends included) or :mod:`multiprocessing`: the list yielded gains one line per process that started
    (its command), :data:`QUICK_TOOLS` left out. Nothing is stopped: the processes run as they would."""
    started: list[str] = []
    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start

    def recording_init(self, args, *rest, **kwargs):
        popen_init(self, args, *rest, **kwargs)  # (a program that is not there starts nothing: not recorded)
        argv = [os.fsdecode(a) for a in ([args] if isinstance(args, str | bytes | os.PathLike) else args)]
        program = (argv[0].split() or [""])[0] if kwargs.get("shell") and argv else argv[0] if argv else ""
        if not _quick(program):
            started.append(" ".join(argv)[:200])

    def recording_start(self):
        process_start(self)
        started.append(f"multiprocessing {self.name} (target {getattr(self, '_target', None)!r})"[:200])

    subprocess.Popen.__init__ = recording_init
    multiprocessing.process.BaseProcess.start = recording_start
    try:
        yield started
    finally:
        subprocess.Popen.__init__ = popen_init
        multiprocessing.process.BaseProcess.start = process_start
