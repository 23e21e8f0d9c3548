"""The Cost/Benefit table's verdicts: the results document's words, given by the observed ranking, each
followed by how sure it is. Pure: a per-variant table and the tested comparisons in, a table out.

The words are the seed document's: *Best quality* (the largest observed improvement), *Best
quality/cost ratio* (the largest improvement per unit of cost), *Solid* (at least 0.020) or *Modest*,
and *Not worth it* (no improvement); *Worse* where the Δ is resolved higher than the baseline's. A cost
qualifier follows where one applies: *expensive* (more than 1.25x the cost of the cheapest improvement),
*simpler* (fewer mechanisms than every variant ranked above it: :func:`attnres.variants.traits.mechanisms`),
*cheap* (within 10% of the cheapest improvement's cost). The ranking is what the data show; the evidence after
the dash is the test of that label's claim (*Best quality*: first against second, then against the baseline),
and a label or stars the tests do not back carry :data:`TENTATIVE` in themselves.
"""

from __future__ import annotations

import pandas as pd

from attnres.reports import costs
from attnres.reports.evidence import Comparison, backs_lower, evidence_text
from attnres.reports.stats import shown, stars
from attnres.reports.tables import baseline_row
from attnres.variants.registry import VARIANTS
from attnres.variants.traits import mechanisms

SPEED, MEMORY = "Speed (tok/s vs baseline)", "Memory (vs baseline)"  # one sign: change vs the baseline
SOLID = 0.020  # eval loss: ★★★ on the stars' scale
EXPENSIVE, CHEAP = 1.25, 1.10  # cost relative to the cheapest improvement
TENTATIVE = " (tentative)"  # right after a label or stars that its tests do not back: "Best quality (tentative)"
NO_TEST = "untested: no test against the baseline (its runs ended early or are not there)"

RULE = ("Verdict: the results document's words, given by the observed ranking of the Δs: *Best quality* is the "
        "largest improvement, *Best quality/cost ratio* the largest per unit of cost (the tok/s lost % + the memory "
        "added %, at least 1, among variants whose costs were measured alike and not within run-to-run noise; one "
        "variant may earn both), the "
        "others *Solid* (≥ 0.020) or *Modest*; *Not worth it* is no improvement, and *Worse* a Δ resolved higher "
        "than the baseline's. Labels and stars follow the Δ as printed (three decimals). A cost qualifier follows: "
        "*expensive* (over 1.25x the cheapest improvement's cost), *simpler* (fewer mechanisms than every variant "
        "ranked above it), *cheap* (within 10% of the cheapest improvement's cost). After the dash, the test of the "
        "label's claim (see Statistical Evidence): for *Best quality*, first against second (\"vs X, second: ...\"), "
        "then its Δ against the baseline (\"; vs baseline: ...\"); for every other label, its Δ against the "
        "baseline: resolved with its Holm-adjusted p, unresolved with the seeds per arm that would resolve it, or "
        "untested. *(tentative)* right after a label or its stars marks what the tests do not back: an improvement "
        "(its stars, *Solid*, *Modest*, *Best quality/cost ratio*) whose Δ is not resolved lower than the "
        "baseline's, and *Best quality* unless it is resolved ahead of both the second and the baseline (of the "
        "baseline alone where it is the only variant compared); *Not worth it* unless its Δ is resolved (no "
        "improvement seen is not no improvement shown). The cost ranking itself rests on the costs as measured, "
        "which no test covers. Runs that ended early are left out.")


def _qualifier(variant: str, cost: pd.Series, above: list[str], ratio_only: bool) -> str:
    known = cost.dropna()
    if ratio_only or variant not in known or len(known) < 2:
        return ""
    cheapest = float(known.min())
    if cost[variant] > EXPENSIVE * cheapest:
        return "expensive"
    if above and variant in VARIANTS and all(u in VARIANTS for u in above) and \
            mechanisms(variant) < min(mechanisms(u) for u in above):
        return "simpler"
    return "cheap" if cost[variant] <= CHEAP * cheapest else ""


def cost_benefit(table: pd.DataFrame, baseline: str, tests: dict[str, Comparison] | None = None,
                 runs: pd.DataFrame | None = None, benches: pd.DataFrame | None = None, preset: str = "",
                 bench_args: list[str] | None = None, top: Comparison | None = None) -> pd.DataFrame:
    """Quality Δ (stars), speed and memory change vs baseline (%, from like with like: :mod:`reports.costs`),
    and a verdict per variant (:data:`RULE`); ``tests`` are the variants' comparisons with the baseline (their
    evidence follows each verdict), ``top`` the test of the first-ranked variant against the second (the
    evidence of *Best quality*), ``runs`` the scope's runs (their conditions), ``benches`` the stored bench
    rows of its preset."""
    cols = ["Variant", "Quality (eval Δ)", SPEED, MEMORY, "Verdict"]
    base = baseline_row(table, baseline)
    t = table[(table["variant"] != baseline) & (table["mark"] == "")].copy()
    if t.empty:
        return pd.DataFrame(columns=cols)
    if runs is None:  # (no run table: every figure as recorded)
        runs = pd.DataFrame({"id": [r for ids in table["run_ids"] for r in ids.values()]})
    bench_rows = benches if benches is not None else pd.DataFrame(columns=["session", "device", "variant"])
    t["raw"] = t["eval"] - base["eval"]
    t["delta"] = [shown(d) for d in t["raw"]]  # labels follow the Δ as printed (ties: the unrounded one)
    figures = {v: costs.cost(v, baseline, table, runs, bench_rows) for v in t["variant"]}
    t["speed"] = [figures[v].speed for v in t["variant"]]
    t["memory"] = [figures[v].memory for v in t["variant"]]
    t = t.sort_values(["delta", "raw"], kind="stable").set_index("variant", drop=False)
    noisy = pd.Series([costs.within_noise(figures[v].speed_from) for v in t.index], index=t.index)
    known = t["speed"].notna() & t["memory"].notna() & ~noisy  # (a speed within run-to-run noise ranks nothing)
    t["cost"] = (t["speed"].clip(upper=0).abs() + t["memory"].clip(lower=0)).clip(lower=1).where(known)
    better = t[t["delta"] < 0]
    best_q = better["delta"].idxmin() if len(better) else None
    priced = better[better["cost"].notna()]  # a cost not measured alike, or within noise, ranks nothing
    best_r = (-priced["delta"] / priced["cost"]).idxmax() if len(priced) else None

    base_tests = tests or {}

    def verdict(v: str) -> str:
        test = base_tests.get(v)
        against = evidence_text(test) if test is not None else NO_TEST
        if test is not None and test.resolved and test.delta > 0:
            return f"Worse — {against}"  # resolved behind the baseline: never a word that reads like a tie
        if t.at[v, "delta"] >= 0:  # no improvement seen: tentative until a test says the Δ is not noise
            return f"Not worth it{'' if test is not None and test.resolved else TENTATIVE} — {against}"
        backed = backs_lower(test)
        ahead = top is not None and top.a == v
        earned = [w + ("" if ok else TENTATIVE) for w, who, ok in (
            ("Best quality", best_q, backed and (len(t) == 1 or (ahead and backs_lower(top)))),
            ("Best quality/cost ratio", best_r, backed)) if v == who]
        label = "; ".join(earned) or ("Solid" if -t.at[v, "delta"] >= SOLID else "Modest") + \
            ("" if backed else TENTATIVE)
        above = list(better.index[: list(better.index).index(v)])
        qualifier = _qualifier(v, better["cost"], above, ratio_only=v == best_r)
        label += f", {qualifier}" if qualifier else ""
        if v != best_q:
            return f"{label} — {against}"
        if len(t) == 1:
            first = "the only variant compared"
        elif ahead:
            first = f"vs {top.b}, second: {evidence_text(top)}"
        else:
            first = f"vs {t.index[1]}, second: untested (no test of the first against the second)"
        return f"{label} — {first}; vs baseline: {against}"

    def quality(v: str) -> str:
        d = t.at[v, "delta"]
        return f"{stars(d)}{TENTATIVE if d < 0 and not backs_lower(base_tests.get(v)) else ''} ({d:+.3f})"

    out = pd.DataFrame({
        "Variant": t["variant"],
        "Quality (eval Δ)": [quality(v) for v in t.index],
        cols[2]: [costs.cell(figures[v].speed, figures[v].speed_from) for v in t.index],
        cols[3]: [costs.cell(figures[v].memory, figures[v].memory_from) for v in t.index],
        "Verdict": [verdict(v) for v in t.index],
    }, columns=cols).reset_index(drop=True)
    out.attrs.update(best_quality=best_q, best_ratio=best_r,
                     note=costs.note(figures, runs, bench_rows, baseline, preset, bench_args))
    return out
