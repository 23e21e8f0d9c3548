"""A study's limits (``attnres study --max-runs --max-hours --deadline --max-stages``), checked when parsed.

A limit that cannot be a budget is one line and exit 2 before anything is recorded: a count below 1, hours that are
not a number above 0 (``nan`` and ``inf`` included), a deadline that does not parse or has passed. A study records
its limits (a deadline as an absolute time, so a study continued later keeps the end it was given).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from attnres.errors import AttnresError

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SPAN = re.compile(r"(?:\d+(?:\.\d+)?[dhms])+")


@dataclass(frozen=True)
class Limits:
    """What a study may spend. None: no limit of that kind."""

    max_runs: int | None = None  # runs its stages may hold
    max_hours: float | None = None  # device-hours (each run's wall time x its ranks)
    deadline: datetime | None = None  # after it, no stage starts (UTC, without a zone, as runs record time)
    max_stages: int | None = None  # stages it may launch

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["deadline"] = self.deadline.isoformat() if self.deadline else None
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> Limits:
        """The limits a study recorded (:meth:`to_dict`)."""
        def given(key: str, kind: Callable[[str], object]) -> Any:
            return None if values.get(key) is None else kind(str(values[key]))

        return cls(given("max_runs", int), given("max_hours", float), given("deadline", datetime.fromisoformat),
                   given("max_stages", int))

    def replaced(self, given: Limits) -> Limits:
        """These limits with each one ``given`` sets in its place (``--resume ID --max-runs 20``)."""
        return replace(self, **{f.name: getattr(given, f.name) for f in fields(given) if getattr(given, f.name)
                                is not None})

    def deadline_text(self) -> str:
        return f"{self.deadline:%Y-%m-%d %H:%M:%S} UTC" if self.deadline else "none"

    def text(self) -> str:
        """The limits in words ("no limit" when none)."""
        parts = [f"at most {self.max_runs} run(s)" if self.max_runs is not None else "",
                 f"{self.max_hours:g} device-hour(s)" if self.max_hours is not None else "",
                 f"{self.max_stages} stage(s)" if self.max_stages is not None else "",
                 f"no stage after {self.deadline_text()}" if self.deadline else ""]
        return ", ".join(p for p in parts if p) or "no limit"


def hours(value: float | None) -> float | None:
    """``--max-hours``: device-hours above 0."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise AttnresError(f"bad --max-hours '{value}': give the device-hours the study may spend, a number above 0 "
                           "(e.g. --max-hours 2.5)")
    return value


def deadline(text: str | None, now: datetime | None = None) -> datetime | None:
    """``--deadline``: an ISO time (``2026-12-06T18:00``, local time unless it names its zone) or a duration from now
    (``90m``, ``2h``, ``1h30m``, ``1d``); as UTC without a zone. One line for one that does not parse or has passed."""
    if text is None:
        return None
    now = now or datetime.now(UTC).replace(tzinfo=None)
    spec = text.strip().lower()
    if _SPAN.fullmatch(spec):
        when = now + timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([dhms])",
                                                                                          spec)))
    else:
        try:
            parsed = datetime.fromisoformat(text.strip())
        except ValueError:
            raise AttnresError(f"bad --deadline '{text}': give an ISO time (2026-12-06T18:00, local time unless it "
                               "names its zone) or a duration from now (90m, 2h, 1h30m, 1d)") from None
        when = parsed.astimezone(UTC).replace(tzinfo=None)  # (a time without a zone is local time)
    if when <= now:
        raise AttnresError(f"--deadline '{text}' is not in the future ({when:%Y-%m-%d %H:%M:%S} UTC, now "
                           f"{now:%Y-%m-%d %H:%M:%S} UTC): give a later time, or a duration such as 2h")
    return when
