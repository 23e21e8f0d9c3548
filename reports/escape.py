"""Escaping recorded data for the documents: one rule for every table cell and free-text line.

Names, devices and messages come from users and other machines (``attnres import`` takes any device
or message). Written into markdown as they are, a ``|`` splits a table row into more columns, a
newline ends it, and ``<script>`` or ``<img onerror=...>`` reaches whoever opens the document as
HTML. Only data is escaped: the document's own markup (bold, links, figures) is written around it.
"""

from __future__ import annotations

import html
from typing import Any

import pandas as pd


def cell_text(value: object) -> str:
    """Data as markdown that shows it literally: HTML escaped (``<`` becomes ``&lt;``), ``|`` as ``\\|``
    (one cell stays one cell), line breaks as spaces (one row stays one row)."""
    return " ".join(html.escape(str(value), quote=False).replace("|", "\\|").splitlines())


def _cell(value: object) -> object:
    return cell_text(value) if isinstance(value, str) else value  # numbers keep their formatting


def escaped(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of a table with every text cell and column name escaped (numbers untouched)."""
    out = df.map(_cell) if len(df) else df.copy()
    out.columns = [cell_text(c) if isinstance(c, str) else c for c in df.columns]
    return out


def markdown_table(df: pd.DataFrame, **kwargs: Any) -> str:
    """``DataFrame.to_markdown`` of the escaped table: the one way the reports write a table."""
    return escaped(df).to_markdown(index=False, **kwargs)
