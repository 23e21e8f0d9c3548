"""Data pipeline: FineWeb-Edu-schema files -> shards with a held-out split -> rank-disjoint batches."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import attnres, runs

from attnres.data.corpus import is_eval
from attnres.data.loader import TokenShards, TrainLoader
from attnres.data.prepare import Source, prepare, read_manifest
from attnres.data.tokenizer import EOT, get_encoding

WORDS = ("the model learns which earlier layers matter for each token while residual streams carry "
         "information across depth and training on educational web text improves reasoning").split()


def fineweb_rows(n: int, seed: int = 0) -> list[dict]:
    """Rows in FineWeb-Edu's schema (text, id, dump, url, language, score, token_count ...)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(20, 120)))).capitalize() + "."
        rows.append({"text": text, "id": f"<urn:uuid:{seed}-{i}>", "dump": "CC-MAIN-2024-10",
                     "url": f"https://example.org/{i}", "language": "en", "language_score": 0.97,
                     "score": 3.1, "int_score": 3, "token_count": len(text.split())})
    return rows


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def split_stream(path, split):
    m = read_manifest(path)
    return np.concatenate([np.fromfile(path / s["file"], dtype=np.uint16) for s in m["splits"][split]["shards"]])


def expected_stream(rows, split, frac=0.1):
    enc = get_encoding()
    out = []
    for r in rows:
        if is_eval(r["id"], frac) == (split == "eval"):
            out += [EOT, *enc.encode_ordinary(r["text"])]
    return np.array(out, dtype=np.uint16)


@pytest.mark.integration
def test_prepare_parquet_and_jsonl_matches_tiktoken_with_disjoint_split(workdir):
    a, b = fineweb_rows(300, seed=1), fineweb_rows(200, seed=2)
    (workdir / "raw").mkdir()
    write_parquet(workdir / "raw" / "part-0.parquet", a)
    write_jsonl(workdir / "raw" / "part-1.jsonl", b)
    proc = attnres("data", "prepare", "--data-files", "raw/*.parquet", "--data-files", "raw/*.jsonl",
                   "--out", "prepared", "--shard-tokens", "3000", check=True)
    assert "500 documents" in proc.stdout
    out = workdir / "prepared"
    for split in ("train", "eval"):
        assert np.array_equal(split_stream(out, split), expected_stream(a + b, split))
    m = read_manifest(out)
    assert len(m["splits"]["train"]["shards"]) > 1  # several shards were written
    assert m["splits"]["train"]["documents"] + m["splits"]["eval"]["documents"] == 500
    assert m["tokenizer"] == "r50k_base" and m["complete"]
    eval_ids = {r["id"] for r in a + b if is_eval(r["id"], 0.1)}
    assert 20 < len(eval_ids) < 90  # about 10% held out, decided per document

    again = attnres("data", "prepare", "--data-files", "raw/*.parquet", "--data-files", "raw/*.jsonl",
                    "--out", "prepared", "--shard-tokens", "3000", check=True)
    assert "already prepared" in again.stdout


def test_interrupted_prepare_resumes_to_the_same_result(tmp_path):
    rows = fineweb_rows(400, seed=3)
    write_jsonl(tmp_path / "d.jsonl", rows)
    src = Source(kind="files", files=[str(tmp_path / "d.jsonl")])
    calls = {"n": 0}

    def crash(docs, tokens):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(src, tmp_path / "a", shard_tokens=2000, batch_docs=32, on_progress=crash)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert not manifest["complete"] and manifest["docs_done"] > 0
    with pytest.raises(Exception, match="partly prepared"):
        read_manifest(tmp_path / "a")
    prepare(src, tmp_path / "a", shard_tokens=2000, batch_docs=32)
    prepare(src, tmp_path / "b", shard_tokens=2000, batch_docs=32)
    for split in ("train", "eval"):
        assert np.array_equal(split_stream(tmp_path / "a", split), split_stream(tmp_path / "b", split))
    assert not list((tmp_path / "a").glob("*.tmp"))


def test_loader_gives_ranks_disjoint_deterministic_resumable_batches(builtin_data):
    shards = TokenShards(builtin_data / "builtin", "train", 64)
    r0 = TrainLoader(shards, 4, seed=42, rank=0, world=2)
    r1 = TrainLoader(shards, 4, seed=42, rank=1, world=2)
    seen = set()
    for step in range(r0.per_epoch + 3):  # crosses an epoch boundary
        a, b = set(r0.indices(step)), set(r1.indices(step))
        assert len(a) == len(b) == 4 and not a & b
        if step < r0.per_epoch:
            assert not (a | b) & seen  # within an epoch no window repeats
            seen |= a | b
    resumed = TrainLoader(shards, 4, seed=42, rank=1, world=2)
    for step in (0, 17, r0.per_epoch + 1):
        x1, y1 = r1.batch(step)
        x2, y2 = resumed.batch(step)
        assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
        assert np.array_equal(x1[:, 1:], y1[:, :-1])  # targets are inputs shifted by one
    other = TrainLoader(shards, 4, seed=7, rank=1, world=2)
    assert not np.array_equal(other.indices(0), r1.indices(0))


def test_builtin_corpus_is_real_prose_with_a_held_out_split(builtin_data):
    m = read_manifest(builtin_data / "builtin")
    assert m["splits"]["train"]["tokens"] > 100_000 and m["splits"]["eval"]["tokens"] > 10_000
    text = get_encoding().decode(split_stream(builtin_data / "builtin", "train")[:400].tolist())
    assert " the " in text


@pytest.mark.integration
def test_the_bytes_tokenizer_needs_no_download_and_its_vocabulary_is_checked_at_launch(workdir, monkeypatch):
    rows = fineweb_rows(40, seed=2)
    write_jsonl(workdir / "d.jsonl", rows)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(workdir / "no-cache"))  # bytes never load tiktoken
    monkeypatch.setenv("ATTNRES_DATA", str(workdir / "data"))
    attnres("data", "prepare", "--data-files", "d.jsonl", "--tokenizer", "bytes", check=True)
    out = workdir / "data" / "files-bytes"  # the default folder says which tokenizer made it
    m = read_manifest(out)
    assert (m["tokenizer"], m["eot"], m["vocab_size"]) == ("utf-8 bytes", 256, 257)
    stream = np.concatenate([split_stream(out, s) for s in ("train", "eval")])
    docs = np.split(stream, np.flatnonzero(stream == 256))[1:]  # each document led by end-of-text
    assert sorted(bytes(d[1:].astype(np.uint8)) for d in docs) == sorted(r["text"].encode() for r in rows)
    # the model must hold the data's ids: refused before anything is recorded, in one line
    bad = attnres("launch", "standard", "--data", "files-bytes", "--set", "vocab_size=200", "--steps", "2")
    assert bad.returncode == 2 and "--set vocab_size=257 or more" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and runs(workdir) == []
    unknown = attnres("data", "prepare", "--tokenizer", "morse")
    assert unknown.returncode == 2 and "unknown tokenizer 'morse'; choose gpt2, bytes" in unknown.stderr


@pytest.mark.integration
@pytest.mark.parametrize(("args", "message"), [
    (["--data-files", "missing/*.parquet"], "no data files match 'missing/*.parquet'"),
    (["--data-files", "bad.parquet"], "has no 'text' column"),
    (["--data-files", "bad.jsonl"], "line 1 has no 'text' field"),
    (["--source", "fineweb-edu"], "--data-files"),
])
def test_bad_input_is_one_clear_line(workdir, args, message):
    write_parquet(workdir / "bad.parquet", [{"content": "no text column here"}])
    (workdir / "bad.jsonl").write_text('{"body": "x"}\n')
    proc = attnres("data", "prepare", *args, "--out", "out")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_missing_tokenizer_files_fail_fast_with_a_clear_line(workdir, monkeypatch):
    empty = workdir / "empty-cache"
    empty.mkdir()
    write_jsonl(workdir / "d.jsonl", fineweb_rows(5))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(empty))
    monkeypatch.setenv("ATTNRES_TOKENIZER_TIMEOUT", "20")
    proc = attnres("data", "prepare", "--data-files", "d.jsonl", "--out", "o", timeout=120)
    assert proc.returncode == 2
    assert "cannot load the GPT-2 tokenizer" in proc.stderr and "TIKTOKEN_CACHE_DIR" in proc.stderr
    assert os.environ.get("TIKTOKEN_CACHE_DIR") == str(empty)


@pytest.mark.integration  # (multiprocessing workers)
def test_worker_processes_write_the_same_shards_as_one_process(tmp_path):
    rows = fineweb_rows(300, seed=4)
    rows[7]["text"] += " a literal <|endoftext|> in the text is ordinary text, ünïcödé too"
    rows[9]["text"] += " and a lone surrogate \ud800 is replaced, as tiktoken's encode_ordinary does"
    write_jsonl(tmp_path / "d.jsonl", rows)
    src = Source(kind="files", files=[str(tmp_path / "d.jsonl")])
    prepare(src, tmp_path / "one", shard_tokens=2500, batch_docs=16, threads=1, workers=1)
    prepare(src, tmp_path / "two", shard_tokens=2500, batch_docs=16, workers=2)
    one, two = read_manifest(tmp_path / "one"), read_manifest(tmp_path / "two")
    assert one["splits"] == two["splits"]  # the same shards, in the same order, with the same sha256
    for split in ("train", "eval"):
        assert np.array_equal(split_stream(tmp_path / "two", split), expected_stream(rows, split))
    capped = Source(kind="files", files=[str(tmp_path / "d.jsonl")], max_tokens=3000)
    prepare(capped, tmp_path / "cap1", batch_docs=16, workers=1)
    prepare(capped, tmp_path / "cap2", batch_docs=16, workers=2)
    assert read_manifest(tmp_path / "cap1")["splits"] == read_manifest(tmp_path / "cap2")["splits"]
