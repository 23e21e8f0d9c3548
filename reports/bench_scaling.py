"""``attnres bench scaling``: how the scaling study's intervals and checks do on ladders whose truth is known.

Each draw is one synthetic ladder of a baseline and a variant, made like a real small one: 4 to 6 sizes over
1.5 to 2 decades of compute from 1e12 FLOPs (log-spaced, inner sizes moved by up to ±0.05 decade), 2 or 3
seeds a size, each run's loss its curve plus normal seed noise of σ drawn from 0.01 to 0.03 nats (as real
small runs' seeds spread). The variant trains on 3% more FLOPs a size (its depth attention) and is worth
1.25× the baseline's compute: its loss at compute C is the baseline's curve at 1.25·C, so its true
compute-equivalent multiplier is 1.25 everywhere. Four kinds of ladder:

* **true law**: ``L(C) = E + A·x^(−α)``, x = C / 1e12, with E from 1.5 to 3, α from 0.1 to 0.5 and a reducible
  loss A of 0.5 to 1.5 nats at the smallest size;
* **bending**: a sum of two power laws, ``L = E + A₁·x^(−α₁) + A₂·x^(−α₂)``, a fast term (α₁ 0.6 to 1.5, A₁ 0.3
  to 1.5) fading inside the ladder under a slow one (α₂ 0.05 to 0.2, A₂ 0.3 to 1.5), drawn until the bend is
  visible at the ladder's noise: the best single law through the baseline's noiseless size means misses
  them by a lack of fit whose noncentrality ``λ = seeds · Σ miss² / σ²`` is at least :data:`VISIBLE`;
* **faint bending**: the same family drawn until λ is under :data:`VISIBLE`: a bend the seeds' noise hides.
  Its flag rate is the limit of any check of this ladder, not a goal: such a curve is a single law to within
  the noise, and what it gets wrong is only the extrapolation, which the document marks as such;
* **flat**: the baseline a true law, the variant flat at the baseline's loss mid-ladder (a model that stopped
  learning with size, as short runs do).

Measured: on true-law ladders, how often the multiplier's 95% interval at each of the ladder's sizes holds
1.25 (its coverage: over every size of every ladder, at the largest size alone, and by seeds a size; a
measure without a ladder to count is left out) and how often the checks withhold the comparison anyway (a
false flag); on the others, how often the comparison's multipliers are withheld (the flag rate), and for the
two bending kinds the share of the family's draws that were of that kind. A ladder is flagged as the
document withholds: either curve fails :func:`reports.scaling_checks.check_fit`, or has no fit. The checks
need no bootstrap, so only true-law ladders are bootstrapped (``bootstrap`` draws a fit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from attnres.reports import scaling
from attnres.reports.scaling_checks import check_fit

KINDS = ("true law", "bending", "faint bending", "flat")
COVERAGE = ("the ladder's sizes", "the largest size", "2 seeds a size", "3 seeds a size")  # where it is counted
#: λ at which the lack-of-fit test (at 2.5%, on 1-3 and 4-12 df) finds one curve's bend 61-93% of the time; a
#: bending ladder has two such curves, and most of its draws bend more
VISIBLE = 20.0
WORTH = 1.25
OVERHEAD = 1.03
C0 = 1e12


def _grid(rng: np.random.Generator) -> tuple[np.ndarray, int, float]:
    """A ladder's computes (one a size), its seeds a size and its seed noise σ."""
    sizes = int(rng.integers(4, 7))
    logs = np.linspace(0.0, rng.uniform(1.5, 2.0), sizes)
    logs[1:-1] += rng.uniform(-0.05, 0.05, sizes - 2)
    return C0 * 10**logs, int(rng.integers(2, 4)), float(rng.uniform(0.01, 0.03))


def _true_law(rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    e, alpha, reducible = rng.uniform(1.5, 3.0), rng.uniform(0.1, 0.5), rng.uniform(0.5, 1.5)
    return lambda c: scaling.law(c / C0, e, reducible, alpha)


def _bending(rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    e = rng.uniform(1.5, 3.0)
    fast, a_fast = rng.uniform(0.6, 1.5), rng.uniform(0.3, 1.5)
    slow, a_slow = rng.uniform(0.05, 0.2), rng.uniform(0.3, 1.5)
    return lambda c: e + a_fast * (c / C0) ** -fast + a_slow * (c / C0) ** -slow


def bend_visibility(curve: Callable[[np.ndarray], np.ndarray], compute: np.ndarray, seeds: int,
                    sigma: float) -> float:
    """The noncentrality λ of the lack of fit a single law would show on ``curve``'s noiseless size means:
    ``seeds · Σ miss² / σ²`` (the lack-of-fit F test's power is set by λ and its degrees of freedom alone)."""
    means = curve(compute)
    point = scaling._fit_points(compute, means)
    if point is None:
        return math.inf
    return seeds * float(np.sum((means - scaling.law(compute, *point)) ** 2)) / sigma**2


def synthetic_ladder(kind: str, rng: np.random.Generator) -> pd.DataFrame:
    """One ladder of ``kind`` (see the module): a baseline 'standard' and a variant 'attnres', runs as the fits
    take them (variant, setting, seed, size, compute, loss)."""
    tries = 0
    while True:
        tries += 1
        compute, seeds, sigma = _grid(rng)
        curve = _true_law(rng) if kind in ("true law", "flat") else _bending(rng)
        if kind in ("bending", "faint bending"):
            visible = bend_visibility(curve, compute, seeds, sigma) >= VISIBLE
            if visible != (kind == "bending"):
                continue
        break
    middle = float(curve(np.array(math.sqrt(compute[0] * compute[-1]))))
    rows = []
    for i, c in enumerate(compute):
        for variant, at in (("standard", c), ("attnres", c * OVERHEAD)):
            truth = middle if kind == "flat" and variant == "attnres" else float(
                curve(np.array(at * (WORTH if variant == "attnres" else 1.0))))
            rows += [{"variant": variant, "setting": "", "seed": s, "size": f"s{i}", "compute": at,
                      "loss": truth + rng.normal(0.0, sigma)} for s in range(seeds)]
    out = pd.DataFrame(rows)
    out.attrs["tries"] = tries  # draws of the family it took (a bending's: how rare a visible bend is)
    return out


def _flagged(runs: pd.DataFrame, found: dict[str, scaling.Fit]) -> bool:
    """Whether the document withholds the comparison's multipliers (either curve fails a check, or has no fit)."""
    return any(not f.ok or check_fit(runs, f).fails for f in found.values())


def bench_scaling(draws: int = 100, bootstrap: int = scaling.BOOTSTRAP, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """``draws`` ladders of each kind: coverage and false flags on true-law ladders, flag rates on the others."""
    rng = np.random.default_rng(seed)
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    for kind in KINDS:
        flagged, tries, tally = 0, 0, {key: [0, 0] for key in COVERAGE}
        for d in range(draws):
            if progress:
                progress(f"{kind}: ladder {d + 1} of {draws}")
            runs = synthetic_ladder(kind, rng)
            tries += runs.attrs["tries"]
            found = scaling.fits(runs, bootstrap if kind == "true law" else 0)
            flagged += _flagged(runs, found)
            if kind != "true law" or not all(f.ok for f in found.values()):
                continue
            mine = runs[runs["variant"] == "attnres"]
            at = mine.groupby("size")["compute"].median().sort_values()
            seeds = f"{int(mine.groupby('size').size().max())} seeds a size"
            for i, c in enumerate(at):
                _, ci = scaling.multiplier(found["attnres"], found["standard"], float(c))
                if ci is None:
                    continue
                for key in ("the ladder's sizes", seeds) + (("the largest size",) if i == len(at) - 1 else ()):
                    tally[key][0] += ci[0] <= WORTH <= ci[1]
                    tally[key][1] += 1
        out[f"{kind}: ladders"] = draws
        out[f"{kind}: flagged"] = flagged
        out[f"{kind}: flag rate"] = flagged / draws
        if kind in ("bending", "faint bending"):
            out[f"{kind}: share of the family's draws"] = draws / tries
        if kind == "true law":
            out |= {f"true law: multiplier coverage, {key}": hits / n for key, (hits, n) in tally.items() if n}
    out["seconds"] = time.perf_counter() - t0
    return out
