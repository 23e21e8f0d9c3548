"""The file formats of export and import: a table read from, or written to, CSV, JSONL or Parquet.

A CSV export is safe to open in a spreadsheet (OWASP's CSV injection): a text cell that starts with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return, which Excel, LibreOffice and Google Sheets would run as a formula, is
written with a single quote ``'`` in front, and so is one that starts with quotes followed by one of those (so that
the quote added can be told apart); a cell that is a plain number (``-1.5``) is written as it is. (A file with a
carriage return in a cell ends its lines in CRLF, so that the cell is quoted and reads back whole.) Importing a CSV
file undoes it: a text cell of one or more quotes followed by one of those characters loses its first quote. So an
exported file imports back to the same values; a hand-written ``'=x`` imports as ``=x``. Parquet (typed, never
read as formulas) is written as it is, and JSONL is read as it is.

A file is read whole or refused with one line: one whose last line is cut (:func:`read`), one with a column named
twice. What its columns must hold is :mod:`attnres.tracking.transfer`'s to check.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd

from attnres import outputs
from attnres.errors import AttnresError

# a text cell a spreadsheet runs as a formula (its first character after any quotes export added: OWASP's list)
FORMULA = r"'*[=+\-@\t\r]"
QUOTED = r"'+[=+\-@\t\r]"  # one that export wrote with a quote in front: import takes the first quote off
NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"  # a plain number: a spreadsheet reads it as one, not a formula


def write(frame: pd.DataFrame, path: Path, fmt: str) -> None:
    """Write ``frame`` to ``path`` as ``fmt`` (``csv``: safe to open in a spreadsheet, or ``parquet``)."""
    with outputs.atomic(path) as tmp:  # whole or not at all: a reader polling the file never sees half of it
        if fmt == "csv":
            # a cell holding a carriage return is quoted only where CR ends the lines too (Python < 3.12's csv
            # quotes the line terminator's characters alone): such a file's lines end in CRLF, as RFC 4180's do
            cr = bool(_text_cells(frame, "[^\r]*\r"))
            neutralised(frame).to_csv(tmp, index=False, lineterminator="\r\n" if cr else "\n")
        else:
            frame.to_parquet(tmp, index=False)


def _text_cells(frame: pd.DataFrame, pattern: str, plain_numbers: bool = True) -> dict[str, pd.Series]:
    """Per column, which of its text cells start with ``pattern`` (``plain_numbers=False``: a cell that is a plain
    number left out); columns without text (numbers, dates) are skipped."""
    found = {}
    for col in frame.columns:
        try:
            text = frame[col].str
        except AttributeError:  # (pandas gives .str only to a column that holds text)
            continue
        hits = text.match(pattern, na=False)
        if not plain_numbers:
            hits &= ~text.fullmatch(NUMBER, na=False)
        if hits.any():
            found[col] = hits.astype(bool)
    return found


def neutralised(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell a spreadsheet would run as a formula (:data:`FORMULA`; a plain number is not
    one) written with a single quote in front, as OWASP recommends; :func:`restored` takes it off again."""
    hits = _text_cells(frame, FORMULA, plain_numbers=False)
    if not hits:
        return frame
    frame = frame.copy()
    for col, rows in hits.items():
        frame.loc[rows, col] = "'" + frame.loc[rows, col].astype(str)
    return frame


def restored(frame: pd.DataFrame) -> pd.DataFrame:
    """A CSV file's text cells as they were before :func:`neutralised`: a cell of quotes followed by a formula's
    first character (:data:`QUOTED`) loses its first quote."""
    for col, rows in _text_cells(frame, QUOTED).items():
        frame.loc[rows, col] = frame.loc[rows, col].astype(str).str[1:]
    return frame


def read(path: Path) -> pd.DataFrame:
    """A ``.csv``, ``.jsonl`` (``.json``) or ``.parquet`` file as a table, its columns as the file gives them.

    A text file whose last line is cut (an export killed midway, a file still being written) is refused: its
    runs would otherwise be recorded as they say they ended, with only some of their rows.
    """
    why = _cut(path)
    if why:
        raise AttnresError(f"{path}: its last line is cut ({why}): a file still being written, or cut short; "
                           "nothing imported")
    return _read(path)


def _cut(path: Path) -> str | None:
    """Why a text file's last line is cut, or None (a whole file, not a text file, or none at all)."""
    if not (path.suffix in {".csv", ".jsonl", ".json"} and path.is_file() and path.stat().st_size):
        return None
    with path.open("rb") as fh:
        fh.seek(-1, 2)
        why = None if fh.read(1) == b"\n" else "no newline at the end"
    if why is None and path.suffix == ".csv":
        header: list[str] = []
        last: list[str] | None = None  # the last row with fields, none but the header's
        with path.open(newline="", errors="replace") as fh:
            rows = csv.reader(fh, strict=True)
            try:
                header = next(rows, [])
                for row in rows:  # (a quoted field may hold newlines: a row is not a line)
                    last = row or last  # (blank lines are skipped, as pandas does)
            except csv.Error as exc:  # (other odd quoting is left to the reader below)
                why = "a quoted field not closed" if "unexpected end of data" in str(exc) else None
                last = None
        if why is None and last is not None and len(last) < len(header):
            why = f"{len(last)} of the header's {len(header)} fields"
    elif why is None:
        tail = b""
        with path.open("rb") as fh:
            for line in fh:
                tail = line if line.strip() else tail
        try:
            json.loads(tail or b"{}")
        except ValueError:
            why = "not a whole JSON object"
    return why


def _read(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise AttnresError(f"no such file: {path}")
    try:
        if path.suffix == ".csv":
            df = restored(pd.read_csv(path))  # (a cell export quoted, as a spreadsheet formula, back as it was)
            header = pd.read_csv(path, header=None, nrows=1, dtype=str).iloc[0].dropna().tolist()
        elif path.suffix in {".jsonl", ".json"}:
            df = pd.read_json(path, lines=True)
            header = _json_keys(path)
        elif path.suffix == ".parquet":
            df = pd.read_parquet(path)
            header = [str(c) for c in df.columns]
        else:
            raise AttnresError(f"unsupported file '{path}': expected .csv, .jsonl or .parquet")
    except (ValueError, OSError) as exc:
        raise AttnresError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:  # (pandas would keep both as `value` and `value.1`, and the first would be taken unsaid)
        raise AttnresError(f"{path}: column {', '.join(map(repr, twice))} is named twice in the header: "
                           "which one holds the data is not known")
    return df


def _json_keys(path: Path) -> list[str]:
    """Every key of the file's objects, a key given twice in one object listed twice (JSON keeps the last)."""
    keys: list[str] = []

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        names = [k for k, _ in items]
        keys.extend(k for k in names if names.count(k) > 1)
        return dict(items)

    with path.open() as fh:
        for line in fh:
            if line.strip():
                json.loads(line, object_pairs_hook=pairs)
    return keys
