"""How a depth-attention weight travels as a metric: the key ``depth:SITE:SOURCE``.

The trainer hands each site's mean weight on each source over as a metric value under this key, so it
travels the metric path unchanged (spool, batched insert, retries); the database routes it to its own table,
mirrors leave it out, imports check it.
"""

from __future__ import annotations

import re

PREFIX = "depth:"
KEY = re.compile(r"depth:\d{1,6}:[A-Za-z0-9 ]{1,32}")  # what a valid key looks like (imports are checked)


def key(site: int, source: str) -> str:
    """The metric key a depth weight travels under."""
    return f"{PREFIX}{site}:{source}"


def any_keys(keys: set[str]) -> bool:
    """Whether any of these metric keys is a depth weight's (most batches have none: no split needed)."""
    return any(k.startswith(PREFIX) for k in keys)
