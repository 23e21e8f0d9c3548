"""How the documents write a number: one format per kind of figure, for `attnres report`, `attnres compare`
and compare's terminal tables alike.

A loss is ``2.691`` (its std beside it ``± 0.006``), a difference of losses ``-0.026`` (rounded as
:func:`reports.stats.shown` rounds, so a label never disagrees with it), a p-value ``0.399``, a count or a step
``6,000``, throughput ``197k tok/s``, memory ``111.76 GiB``; a value that is not there (None, NaN) is ``—``.

A table can carry its cells' formats (``attrs["formats"]``: column -> function of a cell, ``attrs["headers"]``:
column -> the header shown): :func:`as_text` writes it, the same in the markdown and on the terminal.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from attnres.reports.stats import shown

MISSING = "—"
LOSS = ".3f"  # a loss, a mean of losses, the std beside it (±), a bound of its interval
DELTA = "+.3f"  # a difference of losses
SPREAD = ".4f"  # a std of losses standing alone (the Multi-Seed tables' Std row)
P = ".3g"  # a p-value
STAT = ".4f"  # a t statistic


def missing(x: object) -> bool:
    """None, NaN or NaT: a value that is not there."""
    return x is None or (pd.api.types.is_scalar(x) and not isinstance(x, str) and bool(pd.isna(x)))


def num(x: float, spec: str, none: str = MISSING) -> str:
    """``x`` formatted, or ``none`` when it is missing or not finite."""
    return none if x is None or not math.isfinite(x) else format(x, spec)


def loss(x: float) -> str:
    """'2.691'."""
    return num(x, LOSS)


def delta(d: float) -> str:
    """'-0.026', '+0.000' (never '-0.000')."""
    return num(shown(d), DELTA)


def p_value(p: float) -> str:
    """'0.399', '1.2e-05'."""
    return num(p, P)


def count(x: float) -> str:
    """A whole number (steps, seeds, seeds needed, pairs): '6,000', '3'; '> 100,000' for no finite count (as
    :func:`reports.stats.need_text` says it)."""
    if missing(x):
        return MISSING
    if math.isinf(x):
        return "> 100,000"
    return f"{x:,.0f}"


def gib(n_bytes: float) -> str:
    """Bytes in GiB: '111.76 GiB'."""
    return MISSING if missing(n_bytes) or not math.isfinite(n_bytes) else f"{n_bytes / 2**30:.2f} GiB"


TOKS = "mean tok/s"  # a run's throughput, named the same in the report, `compare` and `status`
TOKS_NOTE = ("mean tok/s: a run's tokens/s over its timed steps, the mean of its logged intervals (each the steps "
             "since the previous log over their wall time); a variant's is the mean of its runs'. `attnres status` "
             "gives each run's.")


def throughput_text(x: float) -> str:
    """Tokens/s that read at any size: ``197k tok/s``, ``12.3k tok/s``, ``845 tok/s``, ``3.2 tok/s`` (never
    ``0.0k``)."""
    if x is None or not math.isfinite(x):
        return MISSING
    if x >= 100_000:
        return f"{x / 1000:,.0f}k tok/s"
    if x >= 1000:
        return f"{x / 1000:.1f}k tok/s"
    return f"{x:.0f} tok/s" if x >= 10 else f"{x:.2g} tok/s"


def throughput_unit(values: object) -> tuple[float, str]:
    """The unit a figure's throughput axis takes for ``values`` (tokens/s), as :func:`throughput_text` would write
    the largest: ``(1000, "k tok/s")`` from 1,000 tok/s up, else ``(1, "tok/s")``; ``(nan, "tok/s")`` when none
    is finite."""
    finite = [float(x) for x in pd.Series(values, dtype=float) if math.isfinite(x)]
    if not finite:
        return math.nan, "tok/s"
    return (1000.0, "k tok/s") if max(finite) >= 1000 else (1.0, "tok/s")


def text(x: object) -> str:
    """A text cell; an empty or missing one is '—'."""
    return MISSING if missing(x) or x == "" else str(x)


def formats(df: pd.DataFrame, by_column: dict[str, Callable[[object], str]],
            headers: dict[str, str] | None = None) -> pd.DataFrame:
    """``df`` with its cells' formats (and the headers to show) attached, for :func:`as_text`; returns ``df``."""
    df.attrs["formats"] = dict(by_column)
    df.attrs["headers"] = dict(headers or {})
    return df


def as_text(df: pd.DataFrame, fallback: Callable[[object], str] = str) -> pd.DataFrame:
    """Every cell as the text a document shows: by the table's formats (:func:`formats`), else ``fallback``
    (a missing value is '—'); headers as the table names them. ``attrs["align"]`` holds each column's
    alignment (numbers right)."""
    by_column = df.attrs.get("formats", {})
    headers = df.attrs.get("headers", {})
    out = pd.DataFrame({
        headers.get(c, c): [by_column[c](v) if c in by_column else MISSING if missing(v) else fallback(v)
                            for v in df[c]]
        for c in df.columns}, index=range(len(df)), dtype=object)
    out.attrs = {"align": ["right" if pd.api.types.is_numeric_dtype(df[c]) else "left" for c in df.columns]}
    return out
