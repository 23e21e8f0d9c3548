"""``attnres bench errors``' power design: does a plan deliver the power it states?

A plan (``attnres next``) asks for the seeds per arm that resolve a comparison with power 0.8. Whether it
keeps that promise is measured here, end to end, through the code a user runs: each world is a fresh SQLite
database where one variant truly differs from the baseline by a known effect ``d`` (Δ over the σ of the
per-seed differences: both arms move with the seed, correlation ``rho``). A pilot of 3 seeds per arm is
imported as one stage and reported; unless that resolves it, ``attnres next --only resolve`` (its function,
:func:`reports.build.next_plan`) plans. A plan that widens the pilot (its registration's purpose: a spread from
too few seeds to promise power within ``cap``) is followed as one more stage, as ``attnres study`` would; the
plan for power is then followed: its seeds are drawn from the same world and imported as the next stage, and
the report is written again. The world counts as resolved when the document calls the variant's Δ resolved
(at the pilot: before a plan for power was made).

Printed per effect: the power the plans delivered (resolved among the worlds a plan was made for: what the
plan promised, 0.8) with its Clopper-Pearson interval; the share of worlds resolved in all (at the pilot or
after the plan); the share whose plan declined (more than ``cap`` seeds per arm: the plan says so rather
than promise what it cannot keep); the median seeds per arm planned; and the median effect the pilot
showed in the worlds planned (a pilot's d̂ runs high in the worlds that reach a plan: the winner's curse).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from attnres.errors import AttnresError
from attnres.reports.bench import _arms, _rate, _report, _rows, resolved_against_baseline, verdicts
from attnres.reports.build import next_plan
from attnres.reports.next_plan import PILOT, PILOT_PURPOSE, RESOLVE
from attnres.reports.scope import Asked
from attnres.tracking.run_store import RunStore

EFFECTS = (0.5, 0.67, 1.0, 1.33, 2.0)
CAP = 1000  # seeds per arm a plan may ask for (`attnres next --max-seeds`' largest)
STAGES = 3  # plans followed until one is for power (a pilot widened to measure the spread comes first)


class World:
    """One truth: the baseline and a variant ``d`` σ of the differences apart; seeds draw values on demand,
    each seed once (its shared movement, ``rho`` of the arms' variance, moves both arms alike)."""

    def __init__(self, rng: np.random.Generator, d: float, sigma: float, rho: float) -> None:
        self.rng, self.sigma, self.rho = rng, sigma, rho
        self.delta = -d * sigma * np.sqrt(2 * (1 - rho))  # the variant is better: a lower eval loss
        self.values: dict[tuple[int, int], float] = {}  # (arm 0 baseline / 1 variant, seed) -> value

    def draw(self, seeds: list[int]) -> None:
        for s in seeds:
            shared = self.rng.normal(0, self.sigma * np.sqrt(self.rho))
            own = self.rng.normal(0, self.sigma * np.sqrt(1 - self.rho), 2)
            self.values[(0, s)] = 3.0 + shared + own[0]
            self.values[(1, s)] = 3.0 + self.delta + shared + own[1]

    def frame(self, names: tuple[str, str], seeds: list[int]) -> pd.DataFrame:
        return pd.DataFrame([r for arm, name in enumerate(names)
                             for r in _rows(name, seeds, [self.values[(arm, s)] for s in seeds])])

    def effect(self, seeds: list[int]) -> float:
        """d̂ from these seeds: the mean paired difference over its std."""
        diffs = np.array([self.values[(1, s)] - self.values[(0, s)] for s in seeds])
        return float(abs(diffs.mean()) / diffs.std(ddof=1))


def _resolved(text: str) -> bool:
    """The document resolved the variant's Δ as the world has it: lower (a resolved higher one, "Worse", is an
    error, not power)."""
    return any(resolved_against_baseline(v) and not v.startswith("Worse") for v in verdicts(text).values())


def power(draws: int = 200, effects: tuple[float, ...] = EFFECTS, sigma: float = 0.015, rho: float = 0.5,
          cap: int = CAP, seed: int = 2, progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """The power plans deliver at each effect size, over ``draws`` worlds each (figures keyed ``d<effect>_``)."""
    if draws < 1 or not effects or any(d <= 0 for d in effects) or cap < PILOT:
        raise AttnresError("bench errors --design power: at least 1 draw, effects above 0, a cap of 3 seeds or more")
    plain, names = _arms()
    arms = (plain, names[0])
    out: dict[str, float] = {"draws": draws, "sigma": sigma, "rho": rho, "pilot_seeds": PILOT, "cap": cap}
    for d in effects:
        rng = np.random.default_rng([seed, round(d * 1000)])
        at_pilot = planned = kept = declined = 0
        sizes, pilot_d = [], []
        for i in range(draws):
            world = World(rng, d, sigma, rho)
            pilot = list(range(1, PILOT + 1))
            world.draw(pilot)
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                resolved, new = _resolved(_report(folder, [world.frame(arms, pilot)])), []
                for _ in range(STAGES):  # a pilot the plan widens (a spread from too few seeds) is one more stage
                    if resolved:
                        break
                    plan = next_plan(RunStore(str(folder / "runs.db")), Asked(plain), max_seeds=cap, kinds=(RESOLVE,))
                    new = sorted({s for _, s, _ in plan.cells((RESOLVE,))})
                    if not new or not any(p.get("purpose") == PILOT_PURPOSE for p in plan.registration):
                        break
                    pilot += new
                    world.draw(new)
                    resolved, new = _resolved(_report(folder, [world.frame(arms, new)])), []
                if resolved:
                    at_pilot += 1
                elif not new:
                    declined += 1  # (or still a pilot after STAGES plans)
                else:
                    planned += 1
                    sizes.append(len(pilot) + len(new))
                    pilot_d.append(world.effect(pilot))
                    world.draw(new)
                    kept += _resolved(_report(folder, [world.frame(arms, new)]))
                RunStore.forget_all()
            if progress:
                progress(f"power: d = {d}, world {i + 1}/{draws}")
        key = f"d{d:g}_"
        out |= {f"{key}{k}": v for k, v in (_rate("plans_delivered", kept, planned) if planned else {}).items()}
        out |= {f"{key}worlds_planned": planned, **{f"{key}{k}": v for k, v in
                                                     _rate("resolved_in_all", at_pilot + kept, draws).items()},
                f"{key}resolved_at_pilot_rate": at_pilot / draws, f"{key}declined_rate": declined / draws,
                f"{key}median_seeds_planned": float(np.median(sizes)) if sizes else float("nan"),
                f"{key}median_pilot_effect_planned": float(np.median(pilot_d)) if pilot_d else float("nan")}
    return out
