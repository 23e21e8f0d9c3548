"""Depth-attention maps: what each site of an AttnRes model attends to, from the recorded weights.

Pure: a long table (run_id, step, site, source, weight) in, matrices and sentences out. A *site* is
a depth step's input (the last site is the readout before the final norm); a *source* is the
embedding, a completed block ``block K``, the current block's ``partial`` state or a ``recent J``
raw output. A *long skip* is weight on a completed block at least two blocks before the site's
own (what plain residuals can only pass on diluted), the paper's point about depth attention.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

LONG = 2  # blocks back: a long skip jumps over at least one whole block


def source_order(label: str) -> tuple[int, int]:
    """Columns of a map in depth order: embedding, blocks, partial, recent outputs."""
    kind, _, num = label.partition(" ")
    rank = {"embedding": 0, "block": 1, "partial": 2, "recent": 3}.get(kind, 4)
    return rank, int(num) if num.isdigit() else 0


def matrix(weights: pd.DataFrame) -> pd.DataFrame:
    """Sites x sources mean weight (NaN where a site has no such source), averaged over runs."""
    m = weights.groupby(["site", "source"])["weight"].mean().unstack("source")
    return m[sorted(m.columns, key=source_order)].sort_index()


def site_block(site: int, block_size: int) -> int:
    """The depth position of a site: 1 + the number of blocks completed before it."""
    return site // block_size + 1


def infer_block_size(m: pd.DataFrame) -> int:
    """Steps per block, from when each block first appears as a source (block 1 first seen at site B)."""
    first = [int(site) for site in m.index[m["block 1"].notna()]] if "block 1" in m.columns else []
    return max(1, first[0]) if first else max(1, len(m.index))


def long_skips(m: pd.DataFrame, top: int = 3) -> list[tuple[int, str, float]]:
    """The strongest (site, block, weight) entries on blocks at least LONG blocks back (ties in site, then
    column, order). Over the whole matrix at once: a 49-site full-AttnRes map has 2,400 cells."""
    blocks = {col: int(match.group(1)) for col in m.columns if (match := re.fullmatch(r"block (\d+)", col))}
    if not blocks or m.empty:
        return []
    size = infer_block_size(m)
    sub = m[list(blocks)]
    here = np.array([site_block(int(site), size) for site in sub.index])[:, None]
    values = sub.to_numpy(dtype=float)
    keep = (here - np.array(list(blocks.values()))[None, :] >= LONG) & ~np.isnan(values)
    found = [(int(sub.index[i]), str(sub.columns[j]), float(values[i, j])) for i, j in zip(*np.nonzero(keep),
                                                                                         strict=True)]
    return sorted(found, key=lambda f: -f[2])[:top]


def site_name(site: int, n_sites: int) -> str:
    return "readout" if site == n_sites - 1 else f"site {site}"


def summary(m: pd.DataFrame) -> str:
    """One paragraph: the weight on the embedding (over the sites that choose: a site with one source has weight
    1 on it whatever was learnt) and the strongest long skips."""
    n = len(m.index)
    parts = []
    choice = m[m.notna().sum(axis=1) > 1]  # a site with one source (the first) puts all its weight there: no choice
    if "embedding" in choice.columns and choice["embedding"].notna().any():
        emb = choice["embedding"].dropna()
        top = int(emb.idxmax())
        skipped = len(m) - len(choice)
        parts.append(f"weight on the embedding: mean {emb.mean():.2f} over {len(emb)} sites"
                     + (f" (not counting {skipped} with one source)" if skipped else "")
                     + f", largest {emb.max():.2f} at {site_name(top, n)}")
    skips = long_skips(m)
    if skips:
        parts.append("strongest long skips: "
                     + ", ".join(f"{site_name(s, n)} ← {src} ({w:.2f})" for s, src, w in skips))
    else:
        parts.append("no long skips (no site is two or more blocks past a completed block)")
    return "; ".join(parts) + "."
