"""Turn a document source into uint16 token shards with a manifest.

Layout of a prepared dataset folder::

    manifest.json           source, tokenizer, counts, shard list with sha256; "complete" flag
    train_000000.bin ...    uint16 tokens (GPT-2's, or UTF-8 bytes), each document preceded by end-of-text
    eval_000000.bin ...     the held-out documents (chosen by id hash, never in train)

Shards are written to ``*.tmp`` and renamed only when whole, and the manifest is rewritten
atomically after every checkpoint, so an interrupted prepare never leaves a half shard that
looks complete: re-running skips the documents already in finished shards and goes on.
Re-running a complete prepare with the same parameters is a no-op.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import tiktoken

from attnres import outputs, paths
from attnres.data import corpus
from attnres.data.tokenizer import EOT, TOKENIZERS, check_tokenizer, encode_bytes, get_encoding, led_by
from attnres.errors import AttnresError

MANIFEST = "manifest.json"
SPLITS = ("train", "eval")


@dataclass
class Source:
    """What to prepare; its fields (and eval_fraction) identify the dataset in the manifest."""

    kind: str  # "builtin" | "files" | "hub"
    files: list[str] = field(default_factory=list)
    repo: str = corpus.FINEWEB_REPO
    config: str = corpus.FINEWEB_CONFIG
    max_tokens: int = 0  # 0 = no cap
    eval_fraction: float = 0.1
    tokenizer: str = "gpt2"  # a key of TOKENIZERS

    def documents(self) -> Iterator[corpus.Document]:
        if self.kind == "builtin":
            return corpus.builtin_documents()
        if self.kind == "files":
            return corpus.file_documents(self.files)
        return corpus.hub_documents(self.repo, self.config)

    def identity(self) -> dict:
        d = asdict(self)
        if self.tokenizer == "gpt2":  # (as datasets prepared before there was a choice recorded it)
            del d["tokenizer"]
        if self.kind == "files":
            d["files"] = [str(Path(f).resolve()) for f in corpus._expand(self.files)]
        return d


#: the names ``attnres data prepare --source`` takes, and the kind of :class:`Source` each is
SOURCE_NAMES = {"builtin": "builtin", "files": "files", "fineweb-edu": "hub"}


def source_for(name: str, data_files: list[str] | None = None, config: str = corpus.FINEWEB_CONFIG,
               max_tokens: int = 0, eval_fraction: float = 0.1, out: Path | None = None,
               tokenizer: str = "gpt2") -> tuple[Source, Path]:
    """The :class:`Source` a user named and the folder its dataset goes to (``out``, else ``data/<name>``,
    ``data/<name>-bytes`` for the bytes tokenizer).

    Files given without a source mean ``files``. Bad combinations are one clear line.
    """
    if data_files and name == "builtin":
        name = "files"
    if name not in SOURCE_NAMES:
        raise AttnresError(f"unknown source '{name}'; choose {', '.join(SOURCE_NAMES)}")
    if name == "files" and not data_files:
        raise AttnresError("--source files needs --data-files PATH_OR_GLOB")
    if not 0 < eval_fraction < 1:
        raise AttnresError("--eval-fraction must be between 0 and 1")
    if max_tokens < 0:
        raise AttnresError("--max-tokens must be 0 (no cap) or more")
    check_tokenizer(tokenizer)
    src = Source(kind=SOURCE_NAMES[name], files=list(data_files or []), config=config, max_tokens=max_tokens,
                 eval_fraction=eval_fraction, tokenizer=tokenizer)
    target = Path(out) if out is not None else paths.dataset(name if tokenizer == "gpt2" else f"{name}-{tokenizer}")
    _check_target(target)
    return src, target


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise AttnresError(f"--out '{out}' is {outputs.special(out) or 'a file'}: a dataset is a folder (give a new "
                           "or empty folder)")


@dataclass
class Summary:
    path: Path
    documents: int
    tokens: dict[str, int]
    seconds: float
    skipped: bool  # True when the dataset was already complete


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def read_manifest(path: Path) -> dict:
    """The manifest of a prepared dataset; a clear error if there is none."""
    m = Path(path) / MANIFEST
    if not m.exists():
        raise AttnresError(f"no prepared data at '{path}': run `attnres data prepare` first")
    manifest = json.loads(m.read_text())
    if not manifest.get("complete"):
        raise AttnresError(f"data at '{path}' is only partly prepared: re-run `attnres data prepare`")
    return manifest


def _fresh_manifest(source: Source) -> dict:
    name, eot, vocab = TOKENIZERS[source.tokenizer]
    return {
        "version": 1, "source": source.identity(), "tokenizer": name, "eot": eot,
        "vocab_size": vocab, "dtype": "uint16", "complete": False, "docs_done": 0,
        "splits": {s: {"shards": [], "tokens": 0, "documents": 0} for s in SPLITS},
    }


def _batches(docs: Iterator[corpus.Document], size: int) -> Iterator[list[corpus.Document]]:
    while batch := list(islice(docs, size)):
        yield batch


_POOL_ENCODER: tiktoken.Encoding | None = None  # a worker process's encoding, loaded once


def _encode_one(enc: tiktoken.Encoding, text: str) -> np.ndarray:
    """A text as a uint16 array led by <|endoftext|>: tiktoken's ``encode_to_numpy`` (what
    ``encode_ordinary`` gives, as an array: no Python int per token; tiktoken releases the GIL)."""
    try:
        ids = enc.encode_to_numpy(text, disallowed_special=())
    except UnicodeEncodeError:  # a lone surrogate: replaced, as encode_ordinary does
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        ids = enc.encode_to_numpy(text, disallowed_special=())
    return led_by(EOT, ids)


def _encode_texts(enc: tiktoken.Encoding, texts: list[str]) -> list[np.ndarray]:
    return [_encode_one(enc, t) for t in texts]


def _pool_start() -> None:
    global _POOL_ENCODER
    _POOL_ENCODER = get_encoding()


def _pool_encode(texts: list[str]) -> list[np.ndarray]:
    """A worker process's batch (its own encoding, one thread: the processes are the parallelism)."""
    return _encode_texts(_POOL_ENCODER, texts)


def _encoded(batches: Iterator[list[corpus.Document]], threads: int, workers: int,
             tokenizer: str = "gpt2") -> Iterator[tuple[list[corpus.Document], list[np.ndarray]]]:
    """Batches with their token arrays, in the source's order whatever the parallelism: threads in this
    process (``workers`` 1), or ``workers`` processes over batches, a few batches ahead of the writer.
    Bytes need no parallelism: they are a copy."""
    if tokenizer == "bytes":
        for batch in batches:
            yield batch, [encode_bytes(d.text) for d in batch]
        return
    enc = get_encoding()  # here first: a tokenizer that cannot load is one clear line, not a broken pool
    if workers <= 1 and threads <= 1:
        for batch in batches:
            yield batch, _encode_texts(enc, [d.text for d in batch])
        return
    if workers > 1:  # processes over batches, each with its own encoding
        ctx = multiprocessing.get_context("spawn")  # (no fork of a process that may hold threads)
        pool: Executor = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_pool_start)
        encode, width = _pool_encode, workers
    else:  # threads over batches (tiktoken releases the GIL)
        pool, encode, width = ThreadPoolExecutor(threads), functools.partial(_encode_texts, enc), threads
    with pool:  # the next batches are encoded while this thread reads documents and writes shards
        ahead: deque = deque()
        for batch in batches:
            ahead.append((batch, pool.submit(encode, [d.text for d in batch])))
            if len(ahead) > 2 * width:
                done, future = ahead.popleft()
                yield done, future.result()
        while ahead:
            done, future = ahead.popleft()
            yield done, future.result()


def prepare(source: Source, out: Path, shard_tokens: int = 50_000_000, batch_docs: int = 512,
            threads: int | None = None, force: bool = False,
            on_progress: Callable[[int, int], None] | None = None, workers: int = 1) -> Summary:
    """Tokenize ``source`` into ``out``; resume an interrupted run; no-op when already done.

    ``workers`` > 1 encodes batches in that many processes (the shards are the same byte for byte);
    ``on_progress(documents, tokens)`` is called after every batch (the CLI draws a bar).
    """
    out = Path(out)
    _check_target(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnresError(f"cannot create dataset folder '{out}': {exc.strerror}") from None
    mpath = out / MANIFEST
    manifest = json.loads(mpath.read_text()) if mpath.exists() else None
    identity = source.identity()
    if manifest and (force or manifest["source"] != identity):
        if not force:
            raise AttnresError(f"'{out}' holds a different dataset; use another --out or --force")
        for f in out.glob("*.bin*"):
            f.unlink()
        manifest = None
    if manifest and manifest["complete"]:
        tokens = {s: manifest["splits"][s]["tokens"] for s in SPLITS}
        return Summary(out, manifest["docs_done"], tokens, 0.0, skipped=True)
    manifest = manifest or _fresh_manifest(source)
    for stale in out.glob("*.tmp"):
        stale.unlink()

    threads = threads or max(1, os.cpu_count() or 1)
    t0 = time.perf_counter()
    docs = source.documents()
    done = manifest["docs_done"]
    for _ in islice(docs, done):  # documents already in finished shards
        pass
    buffers: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    buffered = {s: 0 for s in SPLITS}
    ndocs = {s: 0 for s in SPLITS}
    total = sum(manifest["splits"][s]["tokens"] for s in SPLITS)
    cap = source.max_tokens

    def checkpoint(final: bool) -> None:
        for split in SPLITS:
            if not buffered[split]:
                continue
            info = manifest["splits"][split]
            name = f"{split}_{len(info['shards']):06d}.bin"
            tmp = out / (name + ".tmp")
            np.concatenate(buffers[split]).astype(np.uint16).tofile(tmp)
            os.replace(tmp, out / name)
            info["shards"].append({"file": name, "tokens": buffered[split], "sha256": _sha256(out / name)})
            info["tokens"] += buffered[split]
            info["documents"] += ndocs[split]
            buffers[split], buffered[split], ndocs[split] = [], 0, 0
        manifest["docs_done"] = done
        manifest["complete"] = final
        _write_json_atomic(mpath, manifest)

    for batch, encoded in _encoded(_batches(docs, batch_docs), threads, workers, source.tokenizer):
        for doc, arr in zip(batch, encoded, strict=True):
            split = "eval" if corpus.is_eval(doc.id, source.eval_fraction) else "train"
            buffers[split].append(arr)
            buffered[split] += len(arr)
            ndocs[split] += 1
            total += len(arr)
            done += 1
            if cap and total >= cap:
                break
            if buffered["train"] >= shard_tokens:
                checkpoint(final=False)
        if on_progress:
            on_progress(done, total)
        if cap and total >= cap:
            break
    checkpoint(final=True)
    if manifest["splits"]["train"]["tokens"] == 0 or manifest["splits"]["eval"]["tokens"] == 0:
        raise AttnresError(f"'{out}': too little data for both a train and an eval split")
    tokens = {s: manifest["splits"][s]["tokens"] for s in SPLITS}
    return Summary(out, done, tokens, time.perf_counter() - t0, skipped=False)


#: the built-in corpus under each tokenizer: names a run's ``data`` may take without a prepare
BUILTIN = {"builtin": "gpt2", "builtin-bytes": "bytes"}


def ensure_builtin(name: str = "builtin") -> Path:
    """Prepare the built-in corpus (``name``: a key of BUILTIN) once; later calls return at once."""
    return prepare(Source(kind="builtin", tokenizer=BUILTIN[name]), paths.dataset(name)).path
