"""The tokenizers a dataset can be prepared with: GPT-2 BPE (the default), or raw UTF-8 bytes.

``bytes`` is nanoGPT's character-level idea for a quick start: a vocabulary of 257 (every byte and
an end-of-text token), no download, and a CPU step that the output layer no longer dominates
(``--set vocab_size=320`` for the model). Results on it are not comparable with GPT-2 runs: the
dataset's name says which it is.

tiktoken downloads its rank file on first use and caches it (``TIKTOKEN_CACHE_DIR``). Its
download has no timeout, so we run the load in a daemon thread and give up after
``ATTNRES_TOKENIZER_TIMEOUT`` seconds: an offline machine gets one clear line, never a hang.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np
import tiktoken

from attnres.errors import AttnresError

ENCODING = "r50k_base"  # GPT-2's ranks and pattern; loads from a cache as "gpt2" does not
EOT = 50256
VOCAB = 50257

#: ``attnres data prepare --tokenizer``: name -> (the manifest's tokenizer, end-of-text id, vocabulary)
TOKENIZERS = {"gpt2": (ENCODING, EOT, VOCAB), "bytes": ("utf-8 bytes", 256, 257)}


def check_tokenizer(name: str) -> str:
    if name not in TOKENIZERS:
        raise AttnresError(f"unknown tokenizer '{name}'; choose {', '.join(TOKENIZERS)}")
    return name


def led_by(eot: int, ids: np.ndarray) -> np.ndarray:
    """A document's token ids as a shard stores them: uint16, after the end-of-text token ``eot``."""
    arr = np.empty(len(ids) + 1, dtype=np.uint16)
    arr[0] = eot
    arr[1:] = ids
    return arr


def encode_bytes(text: str) -> np.ndarray:
    """A text as its UTF-8 bytes, led by the end-of-text token 256 (a lone surrogate becomes '?')."""
    return led_by(TOKENIZERS["bytes"][1], np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8))


@functools.cache
def get_encoding() -> tiktoken.Encoding:
    """Load GPT-2 BPE, or raise AttnresError saying how to make it available offline."""
    result: dict[str, object] = {}

    def load() -> None:
        try:
            result["enc"] = tiktoken.get_encoding(ENCODING)
        except Exception as exc:  # noqa: BLE001 - any failure becomes one clear line below
            result["err"] = exc

    timeout = float(os.environ.get("ATTNRES_TOKENIZER_TIMEOUT", "60"))
    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout)
    if "enc" in result:
        return result["enc"]  # type: ignore[return-value]
    why = f"{type(result['err']).__name__}: {result['err']}" if "err" in result else f"no answer in {timeout:.0f} s"
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", "<unset>")
    raise AttnresError(
        f"cannot load the GPT-2 tokenizer ({ENCODING}; {why.splitlines()[0][:200]}); "
        f"connect to the internet once, or set TIKTOKEN_CACHE_DIR to a folder holding its "
        f"rank file (now: {cache})"
    )
