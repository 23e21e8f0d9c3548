"""The depth-map summary computed over the whole matrix at once says exactly what the cell-by-cell rule said."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from attnres.reports import depth_maps


def cell_by_cell(m: pd.DataFrame, top: int = 3) -> list[tuple[int, str, float]]:
    """The rule as it was written first: every (site, column) cell, one at a time."""
    first = [int(site) for site in m.index if pd.notna(m.loc[site].get("block 1"))]
    size = max(1, first[0]) if first else max(1, len(m.index))
    found = []
    for site in m.index:
        here = int(site) // size + 1
        for col in m.columns:
            match = re.fullmatch(r"block (\d+)", col)
            w = m.loc[site, col]
            if match and pd.notna(w) and here - int(match.group(1)) >= depth_maps.LONG:
                found.append((int(site), col, float(w)))
    return sorted(found, key=lambda f: -f[2])[:top]


def random_map(rng: np.random.Generator, sites: int, size: int, recent: int, ties: bool) -> pd.DataFrame:
    """A long table of one block-structured map: each site sees the embedding, its completed blocks, its partial
    block (after the first step of a block) and up to ``recent`` raw outputs; weights random, or from few values."""
    rows = []
    for site in range(sites):
        done = site // size
        sources = ["embedding", *(f"block {b}" for b in range(1, done + 1))]
        sources += ["partial"] if site % size else []
        sources += [f"recent {j}" for j in range(1, min(recent, site) + 1)]
        w = rng.choice([0.1, 0.2, 0.3], len(sources)) if ties else rng.dirichlet(np.ones(len(sources)))
        rows += [{"site": site, "source": s, "weight": float(x)} for s, x in zip(sources, w, strict=True)]
    return pd.DataFrame(rows)


def test_long_skips_and_the_summary_equal_the_cell_by_cell_rule():
    rng = np.random.default_rng(3)
    for case in range(60):
        weights = random_map(rng, int(rng.integers(1, 50)), int(rng.integers(1, 7)), int(rng.integers(0, 5)),
                             ties=case % 3 == 0)
        m = depth_maps.matrix(weights)
        assert depth_maps.long_skips(m) == cell_by_cell(m), case
        assert depth_maps.long_skips(m, top=50) == cell_by_cell(m, top=50), case
    m = depth_maps.matrix(random_map(rng, 49, 3, 0, ties=False))
    text = depth_maps.summary(m)
    assert "strongest long skips: " in text and all(f"({w:.2f})" in text for _, _, w in cell_by_cell(m))
