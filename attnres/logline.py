"""One line to the run's log (stdout or stderr), which a full disk under the log must not turn into a crash;
and leaving a process once its log is flushed."""

from __future__ import annotations

import logging
import os
import sys


def say(message: str, err: bool = False) -> None:
    """Print ``message`` and flush; a log that cannot be written (disk full, closed pipe) is skipped."""
    try:
        print(message, file=sys.stderr if err else sys.stdout, flush=True)
    except (OSError, ValueError):
        pass


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown, once the process's work is recorded and its output flushed.

    Unloading torch (and torch._dynamo, where something imported it) takes 0.5-2 s on a CPU: time in
    which a run is over but its trainer, torchrun and the queue still wait.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
