"""Spans of time: how one reads in a line (a duration, ``4m05s``, never a clock-like ``4:05``), and one a user
sets in the environment."""

from __future__ import annotations

import os


def env_seconds(name: str, default: float) -> float:
    """Seconds from ``$NAME`` (``default`` when unset or not a number; never negative)."""
    try:
        return max(0.0, float(os.environ.get(name, default)))
    except ValueError:
        return default


def duration(seconds: float) -> str:
    """A span of time as a duration ("45s", "4m05s", "1h02m"), never as "4:05", which reads as a clock time;
    seconds are left out from an hour on (an ETA is not that precise)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
