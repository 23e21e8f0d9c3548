"""One line to the run's log (stdout or stderr), which a full disk under the log must not turn into a crash."""

from __future__ import annotations

import sys


def say(message: str, err: bool = False) -> None:
    """Print ``message`` and flush; a log that cannot be written (disk full, closed pipe) is skipped."""
    try:
        print(message, file=sys.stderr if err else sys.stdout, flush=True)
    except (OSError, ValueError):
        pass
