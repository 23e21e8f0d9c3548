"""The Cost/Benefit table's verdicts: the results document's words, given by the observed ranking, each
followed by how sure it is. Pure: a per-variant table and the tested comparisons in, a table out.

The words are the seed document's: *Best quality* (the largest observed improvement), *Best
quality/cost ratio* (the largest improvement per unit of cost), *Solid* (at least 0.020) or *Modest*,
and *Not worth it* (no improvement); a cost qualifier follows where one applies: *expensive* (more than
1.25x the cost of the cheapest improvement), *simpler* (fewer mechanisms than every variant ranked above
it: :func:`attnres.traits.mechanisms`), *cheap* (within 10% of the cheapest improvement's cost). The
ranking is what the data show; the evidence after the dash says whether the statistics back it.
"""

from __future__ import annotations

import math

import pandas as pd

from attnres.traits import mechanisms
from attnres.variants import VARIANTS
from reports.evidence import Comparison, evidence_text
from reports.stats import stars
from reports.tables import baseline_row, num

SOLID = 0.020  # eval loss: ★★★ on the stars' scale
EXPENSIVE, CHEAP = 1.25, 1.10  # cost relative to the cheapest improvement

RULE = ("Verdict: the results document's words, given by the observed ranking of the Δs: *Best quality* is the "
        "largest improvement, *Best quality/cost ratio* the largest per unit of cost (speed cost % + memory cost %, "
        "at least 1; one variant may earn both), the others *Solid* (≥ 0.020) or *Modest*; *Not worth it* is no "
        "improvement. A cost qualifier follows: *expensive* (over 1.25x the cheapest improvement's cost), "
        "*simpler* (fewer mechanisms than every variant ranked above it), *cheap* (within 10% of the cheapest "
        "improvement's cost). After the dash, the evidence for its Δ against the baseline (see Statistical "
        "Evidence): resolved with its Holm-adjusted p, unresolved with the seeds per arm that would resolve it, or "
        "untested. Runs that ended early are left out.")


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


def cost_benefit(table: pd.DataFrame, baseline: str, tests: dict[str, Comparison] | None = None) -> pd.DataFrame:
    """Quality Δ (stars), speed and memory cost vs baseline (%), and a verdict per variant (:data:`RULE`);
    ``tests`` are the variants' comparisons with the baseline (their evidence follows each verdict)."""
    cols = ["Variant", "Quality (eval Δ)", "Speed Cost", "Memory Cost", "Verdict"]
    base = baseline_row(table, baseline)
    t = table[(table["variant"] != baseline) & (table["mark"] == "")].copy()
    if t.empty:
        return pd.DataFrame(columns=cols)
    t["delta"] = t["eval"] - base["eval"]
    t["speed"] = (t["tokens_per_s"] / base["tokens_per_s"] - 1) * 100
    t["memory"] = (t["peak_memory_bytes"] / base["peak_memory_bytes"] - 1) * 100
    t = t.sort_values("delta", kind="stable").set_index("variant", drop=False)
    known = t["speed"].notna() & t["memory"].notna()
    t["cost"] = (t["speed"].clip(upper=0).abs() + t["memory"].clip(lower=0)).clip(lower=1).where(known)
    better = t[t["delta"] < 0]
    best_q = better["delta"].idxmin() if len(better) else None
    best_r = (-better["delta"] / better["cost"].fillna(1)).idxmax() if len(better) else None

    def verdict(v: str) -> str:
        if t.at[v, "delta"] >= 0:
            label = "Not worth it"
        else:
            earned = [w for w, who in (("Best quality", best_q), ("Best quality/cost ratio", best_r)) if v == who]
            label = "; ".join(earned) or ("Solid" if -t.at[v, "delta"] >= SOLID else "Modest")
            above = list(better.index[: list(better.index).index(v)])
            qualifier = _qualifier(v, better["cost"], above, ratio_only="Best quality/cost ratio" in earned)
            label += f", {qualifier}" if qualifier else ""
        test = (tests or {}).get(v)
        return label + (f" — {evidence_text(test)}" if test is not None else
                        " — untested: no test against the baseline (its runs ended early or are not there)")

    out = pd.DataFrame({
        "Variant": t["variant"],
        "Quality (eval Δ)": [f"{stars(d)} ({d:+.3f})" for d in t["delta"]],
        "Speed Cost": [num(s, "+.0f") + ("%" if math.isfinite(s) else "") for s in t["speed"]],
        "Memory Cost": [num(m, "+.0f") + ("%" if math.isfinite(m) else "") for m in t["memory"]],
        "Verdict": [verdict(v) for v in t.index],
    }, columns=cols).reset_index(drop=True)
    out.attrs.update(best_quality=best_q, best_ratio=best_r)
    return out
