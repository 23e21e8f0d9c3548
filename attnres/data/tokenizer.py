"""GPT-2 BPE through tiktoken, with a bounded wait and a clear error when it cannot load.

tiktoken downloads its rank file on first use and caches it (``TIKTOKEN_CACHE_DIR``). Its
download has no timeout, so we run the load in a daemon thread and give up after
``ATTNRES_TOKENIZER_TIMEOUT`` seconds: an offline machine gets one clear line, never a hang.
"""

from __future__ import annotations

import functools
import os
import threading

import tiktoken

from attnres.errors import AttnresError

ENCODING = "r50k_base"  # GPT-2's ranks and pattern; loads from a cache as "gpt2" does not
EOT = 50256
VOCAB = 50257


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
