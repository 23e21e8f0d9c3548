"""User-facing errors.

Anything a user can cause by typing something wrong raises :class:`AttnresError`. The CLI turns
it into one line on stderr and exit code 2, so bad input never shows a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AttnresError(Exception):
    """An error caused by input, printed as one line; the process exits with ``exit_code``."""

    exit_code = 2


def unknown(kind: str, name: str, choices: Iterable[str]) -> AttnresError:
    """Build the 'unknown X' error with a did-you-mean suggestion when one is close (a typo is the usual
    cause: naming the intended name beats listing them all); the suggestion is quoted like the name, so it
    can be copied as is."""
    choices = sorted(choices)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f"; choose one of: {', '.join(choices)}"
    return AttnresError(f"unknown {kind} '{name}'{hint}")
