"""Document sources: the built-in offline corpus, local FineWeb-Edu-schema files, the hub.

Every source yields :class:`Document` (a stable id and its text). The split into train and
held-out eval is decided per document id, so it never depends on order or batch boundaries.

The built-in corpus is the Python documentation's topic pages (``pydoc_data.topics``): about
465 kB of real English technical prose shipped with every CPython, so nothing is downloaded.
"""

from __future__ import annotations

import glob
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnres.errors import AttnresError

FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_CONFIG = "sample-10BT"


@dataclass(frozen=True)
class Document:
    id: str
    text: str


def builtin_documents() -> Iterator[Document]:
    """The Python docs' topic pages, one document each, in a fixed order."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield Document(f"pydoc:{key}", topics[key])


def _doc_id(row: dict, fallback: str) -> str:
    return str(row.get("id") or fallback)


def _expand(patterns: list[str]) -> list[Path]:
    files: list[Path] = []
    for pattern in patterns:
        matched = sorted(glob.glob(pattern, recursive=True))
        if not matched:
            raise AttnresError(f"no data files match '{pattern}'")
        files += [Path(m) for m in matched]
    for f in files:
        if f.suffix not in {".parquet", ".jsonl", ".json"}:
            raise AttnresError(f"unsupported data file '{f}': expected .parquet or .jsonl")
    return files


def file_documents(patterns: list[str]) -> Iterator[Document]:
    """Rows of FineWeb-Edu-schema parquet or JSONL files (a ``text`` column, optional ``id``)."""
    import pyarrow.parquet as pq

    for path in _expand(patterns):
        if path.suffix == ".parquet":
            try:
                pf = pq.ParquetFile(path)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
                raise AttnresError(f"cannot read parquet file '{path}': {exc}") from None
            if "text" not in pf.schema_arrow.names:
                raise AttnresError(f"'{path}' has no 'text' column (columns: {', '.join(pf.schema_arrow.names)})")
            cols = ["text"] + (["id"] if "id" in pf.schema_arrow.names else [])
            n = 0
            for batch in pf.iter_batches(columns=cols, batch_size=1024):
                for row in batch.to_pylist():
                    yield Document(_doc_id(row, f"{path.name}:{n}"), row["text"] or "")
                    n += 1
        else:
            with path.open(encoding="utf-8") as fh:
                for n, line in enumerate(fh):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        raise AttnresError(f"'{path}' line {n + 1} is not valid JSON") from None
                    if not isinstance(row, dict) or "text" not in row:
                        raise AttnresError(f"'{path}' line {n + 1} has no 'text' field")
                    yield Document(_doc_id(row, f"{path.name}:{n}"), row["text"] or "")


def hub_documents(repo: str = FINEWEB_REPO, config: str = FINEWEB_CONFIG) -> Iterator[Document]:
    """FineWeb-Edu streamed through ``datasets``; offline it fails with one clear line."""
    try:
        import datasets

        ds = datasets.load_dataset(repo, name=config, split="train", streaming=True)
        rows = iter(ds)
        first = next(rows)
    except Exception as exc:  # noqa: BLE001 - hub/network errors come in many types
        raise AttnresError(
            f"cannot stream {repo} ({config}) from the Hugging Face hub "
            f"({type(exc).__name__}); offline, download its parquet files elsewhere and pass "
            f"them with --data-files 'path/*.parquet'"
        ) from None
    if "text" not in first:
        raise AttnresError(f"{repo} rows have no 'text' field")
    yield Document(_doc_id(first, "hub:0"), first["text"])
    for n, row in enumerate(rows, start=1):
        yield Document(_doc_id(row, f"hub:{n}"), row["text"])


def is_eval(doc_id: str, eval_fraction: float) -> bool:
    """Held-out membership by a hash of the document id: stable, order-free, disjoint."""
    h = int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "big")
    return (h % 1_000_000) < eval_fraction * 1_000_000
