"""Plans that deliver the power they state, and the Holm step every document decides with (issue 46)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from attnres.reports import evidence


def _two_stages(rng: np.random.Generator, d: float, cap: int = 1000) -> str:
    """One world of the power design, through the document's tests: a pilot of 3 paired seeds (stage 1),
    then the seeds per arm its plan asks for (stage 2); 'pilot', 'declined', 'kept' or 'missed'."""
    def look(n: int, x: np.ndarray, y: np.ndarray) -> evidence.Comparison:
        runs = pd.DataFrame([{"id": i * 2 + arm + 1, "variant": v, "seed": i + 1, "status": "finished",
                              "launch_id": 1 if i < 3 else 2} for i in range(n)
                             for arm, v in enumerate(("control_block", "standard"))])
        arms = [pd.Series({"values": dict(enumerate(z[:n], 1)), "run_ids": {i + 1: i * 2 + arm + 1 for i in range(n)}})
                for arm, z in enumerate((x, y))]
        c = evidence.assess(evidence.Comparison("control_block", "standard", evidence.BASELINE, 100), *arms, runs)
        return evidence.control([c])[0]

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        shared = rng.normal(0, 0.015 * math.sqrt(0.5), n)  # σ 0.015 per arm, correlation 0.5: σ of differences 0.015
        return (3.0 - d * 0.015 + shared + rng.normal(0, 0.015 * math.sqrt(0.5), n),
                3.0 + shared + rng.normal(0, 0.015 * math.sqrt(0.5), n))
    x, y = draw(3)
    pilot = look(3, x, y)
    if pilot.resolved:
        return "pilot"
    if not math.isfinite(pilot.need) or pilot.need > cap:
        return "declined"
    more = draw(int(pilot.need) - 3)
    x, y = np.concatenate([x, more[0]]), np.concatenate([y, more[1]])
    return "kept" if look(int(pilot.need), x, y).resolved else "missed"


def test_planned_seed_counts_deliver_the_power_they_state():
    """A plan states power 0.8. From a pilot of 3 seeds, σ is often far below the truth and the plan, made at
    it, delivered 62% at d = 0.67 (the issue's audit: 67%). Planned at σ's 90% upper bound, the plans made
    deliver 0.8 or more: checked here through the document's own tests (`attnres bench errors --design power`
    measures it end to end)."""
    rng = np.random.default_rng(46)
    for d in (0.67, 1.33):
        ends = [_two_stages(rng, d) for _ in range(300)]
        kept, missed = ends.count("kept"), ends.count("missed")
        low = stats.beta.ppf(0.025, kept, missed + 1)  # Clopper-Pearson lower bound of the power delivered
        assert low >= 0.75 and kept / (kept + missed) >= 0.8, (d, kept, missed, ends.count("declined"))


def test_holm_gives_statsmodels_figures(monkeypatch):
    """reports.stats.holm stands in for statsmodels' multipletests(method="holm") (which collects garbage on every
    call): the same rejections and adjusted p-values, ties and order included."""
    import gc

    from statsmodels.stats.multitest import multipletests

    # multipletests calls gc.collect() each time: in a test worker's large heap, 600 calls took 436 s in CI.
    monkeypatch.setattr(gc, "collect", lambda *a, **k: 0)

    from attnres.reports.stats import holm

    rng = np.random.default_rng(5)
    cases = [rng.uniform(0, 0.2, int(n)) for n in rng.integers(1, 12, 200)]
    cases += [np.array([0.01, 0.01, 0.04, 0.2]), np.array([0.0125, 0.0125]), np.array([1.0]), np.array([0.6, 0.6])]
    for p in cases:
        for alpha in (0.05, 0.04, 0.01):
            reject, adjusted = holm(p, alpha)
            ref_reject, ref_adjusted, _, _ = multipletests(p, alpha=alpha, method="holm")
            assert (reject == ref_reject).all() and np.allclose(adjusted, ref_adjusted, rtol=0, atol=1e-15), p
