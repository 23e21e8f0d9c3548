"""Side-by-side comparison of variants: pure functions from DataFrames to tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from attnres.config import flatten
from attnres.reports import costs, identity
from attnres.reports.escape import cell_text, markdown_table
from attnres.reports.numbers import (
    DELTA,
    SPREAD,
    STAT,
    TOKS,
    as_text,
    count,
    delta,
    formats,
    gib,
    loss,
    num,
    p_value,
    text,
    throughput_text,
)
from attnres.reports.stats import (
    ALPHA,
    PAIRED,
    WELCH,
    ReportError,
    decision_confidence,
    design,
    finite,
    flat,
    holm,
    interval,
    level_text,
    mean_ci,
    need_text,
    test_p,
    versus,
)


def aligned_evals(runs: pd.DataFrame, evals: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Seed-mean eval loss per variant at the steps every compared variant reached, and Δ vs the first."""
    merged = finite(evals).merge(runs[["id", "variant"]], left_on="run_id", right_on="id")
    merged = merged[merged["variant"].isin(variants)]
    wide = merged.groupby(["step", "variant"])["value"].mean().unstack("variant")
    missing = [v for v in variants if v not in wide.columns]
    if missing:
        raise ReportError(f"no eval loss recorded for: {', '.join(missing)}")
    wide = wide[variants].dropna()
    if wide.empty:
        raise ReportError("the variants share no eval step")
    first = variants[0]
    for v in variants[1:]:
        wide[f"Δ {v}"] = wide[v] - wide[first]
    wide.index = wide.index.astype(int)
    out = wide.reset_index()
    return formats(out, {"step": count} | dict.fromkeys(variants, loss)
                   | dict.fromkeys([f"Δ {v}" for v in variants[1:]], delta))


def seed_stats(runs: pd.DataFrame, evals: pd.DataFrame, variants: list[str], step: int) -> pd.DataFrame:
    """Per arm at ``step``: seeds, mean, std, 95% CI of the mean; against the first arm: Δ, the test the arms
    get (paired over the per-seed differences when both hold the same seeds, else Welch's: the document's
    rule) with its p-value, Holm's adjustment over the arms compared with the first (:func:`reports.stats.holm`), the
    evidence that gives at α = 0.05, and the Δ's interval for that test at the level that agrees with it
    (95% for one comparison: :func:`reports.stats.decision_confidence`); then Welch's and the paired test
    both, and the seeds per arm an exact power calculation asks for (:func:`reports.stats.seed_plan`: at the
    spread's upper confidence bound, and at the spread as observed)."""
    at = finite(evals)[lambda e: e["step"] == step].merge(runs[["id", "variant", "seed"]], left_on="run_id",
                                                           right_on="id")
    by_seed = {v: dict(zip(g["seed"].astype(int), g["value"], strict=True)) for v, g in at.groupby("variant")}
    ref = by_seed.get(variants[0], {})
    same = identity.same_models(runs[runs["variant"].isin(variants)], prefer=variants)  # one model, two names
    rows = []
    for v in variants:
        mine = by_seed.get(v, {})
        mean, std, lo, hi = mean_ci(np.array(list(mine.values())))
        ev = versus(mine, ref) if v != variants[0] else dict.fromkeys(
            ["t", "p", "paired_t", "paired_p", "seeds_needed", "seeds_observed"], math.nan) | {"pairs": 0, "design": ""}
        tested = v != variants[0] and v not in same and len(mine) >= 2 and len(ref) >= 2
        test = (f"paired ({len(mine)} pairs)" if design(mine, ref) == PAIRED else WELCH) if tested else ""
        p = test_p(mine, ref) if tested and not flat(mine, ref) else math.nan
        diff = mean - float(np.mean(list(ref.values()))) if ref and mine else math.nan
        rows.append({"variant": v, "seeds": len(mine), "mean": mean, "std": std, "ci_low": lo, "ci_high": hi,
                     "delta": diff, "test": test, "p": p, "_arms": (mine, ref),
                     "welch_t": ev["t"], "welch_p": ev["p"], "paired_n": ev["pairs"],
                     "paired_t": ev["paired_t"], "paired_p": ev["paired_p"], "seeds_needed": ev["seeds_needed"],
                     "seeds_at_observed_sd": ev["seeds_observed"], "seeds_for_test": ev["design"]})
    out = pd.DataFrame(rows)
    adjusted = pd.Series(math.nan, index=out.index)
    tested = out.index[out["p"].notna()]
    if len(tested):
        adjusted[tested] = holm(out.loc[tested, "p"].to_numpy())[1]
    level = [decision_confidence(p, q) for p, q in zip(out["p"], adjusted, strict=True)]
    bounds = [interval(*arms, c) if t else (math.nan, math.nan)
              for arms, c, t in zip(out["_arms"], level, out["test"], strict=True)]
    at_p = out.columns.get_loc("p") + 1
    out.insert(at_p, "holm_p", adjusted)
    out.insert(at_p + 1, "evidence", [f"untested: same model as {same[v]}" if v in same else "resolved" if q <= ALPHA
                                      else "unresolved" if q == q else ("" if i == 0 else "untested")
                                      for i, (v, q) in enumerate(zip(out["variant"], adjusted, strict=True))])
    out.attrs["same_model"] = same
    out.insert(at_p + 2, "delta_low", [b[0] for b in bounds])
    out.insert(at_p + 3, "delta_high", [b[1] for b in bounds])
    out.insert(at_p + 4, "level", [level_text(c) if t else "" for c, t in zip(level, out["test"], strict=True)])
    out = out.drop(columns="_arms")
    out.attrs["levels"] = dict(zip(out["variant"], level, strict=True))  # (for the Δ figure's band)
    return formats(out, EVERY_FIGURE)


def _bound(x: object) -> str:
    """A bound of the Δ interval, as the report's Statistical Evidence writes it: '-0.017'."""
    return num(x, DELTA)


def _spread(x: object) -> str:
    return num(x, SPREAD)


def _stat(x: object) -> str:
    return num(x, STAT)


# How the Every figure table writes the seed statistics (:func:`seed_stats`), column by column.
EVERY_FIGURE = {
    "variant": text, "seeds": count, "mean": loss, "std": _spread, "ci_low": loss, "ci_high": loss,
    "delta": delta, "test": text, "p": p_value, "holm_p": p_value, "evidence": text, "delta_low": _bound,
    "delta_high": _bound, "level": text, "welch_t": _stat, "welch_p": p_value, "paired_n": count,
    "paired_t": _stat, "paired_p": p_value, "seeds_needed": count, "seeds_at_observed_sd": count,
    "seeds_for_test": text,
}


def config_diff(runs: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Config fields whose value differs between the variants (seed excluded), one column each."""
    per = {}
    for v in variants:
        row = runs[runs["variant"] == v].iloc[0]
        flat = flatten(json.loads(row["config_json"]))
        flat.pop("seed", None)
        per[v] = flat
    keys = sorted(set().union(*[set(f) for f in per.values()]))
    rows = [{"setting": k, **{v: per[v].get(k, "—") for v in variants}} for k in keys
            if len({json.dumps(per[v].get(k), sort_keys=True) for v in variants}) > 1]
    return pd.DataFrame(rows, columns=["setting", *variants])


def cost(runs: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Mean throughput and peak memory per variant, with change vs the first (%) where both were measured
    under the same conditions (:mod:`reports.costs`); otherwise the change is left out and ``measured``
    says what differs (`attnres report` then takes speed from a stored bench)."""
    mine = runs[runs["variant"].isin(variants)]
    g = mine.groupby("variant")[["tokens_per_s", "peak_memory_bytes"]].mean().reindex(variants)
    column = mine["conditions_json"] if "conditions_json" in mine else pd.Series(None, index=mine.index)
    sets = {v: [costs.condition_sets(c) for c in column[mine["variant"] == v]] for v in variants}
    first = variants[0]
    speed, memory = costs.fields_for([s for v in variants for s in sets[v]])
    speed_ok = [costs.speed_alike(sets[v], sets[first], speed) for v in variants]
    memory_ok = [costs.alike(sets[v], sets[first], memory) for v in variants]
    g["tok/s vs first %"] = ((g["tokens_per_s"] / g["tokens_per_s"].iloc[0] - 1) * 100).where(speed_ok)
    g["memory vs first %"] = ((g["peak_memory_bytes"] / g["peak_memory_bytes"].iloc[0] - 1) * 100).where(memory_ok)
    tps = {v: [float(x) for x in mine.loc[mine["variant"] == v, "tokens_per_s"].dropna()] for v in variants}
    spread = [costs.noise(tps[v], tps[first], (v, first)) if v != first else "" for v in variants]

    def measured(v: str, ok: bool, fields: tuple[str, ...], differ: object = costs.differences) -> str:
        if not ok:
            return "not comparable: " + differ(sets[v], sets[first], fields)  # type: ignore[operator]
        return "conditions not recorded" if costs.unrecorded(sets[v] + sets[first]) else "alike"

    g["tok/s measured"] = [measured(v, ok, speed, costs.speed_differences)
                           for v, ok in zip(variants, speed_ok, strict=True)]
    g["memory measured"] = [measured(v, ok, memory) for v, ok in zip(variants, memory_ok, strict=True)]
    # the speed change with its run-to-run spread, as the report's cost table writes it (reports.costs.noise)
    g["tok/s vs first %"] = [costs.cell(float(p), n) for p, n in zip(g["tok/s vs first %"], spread, strict=True)]
    return formats(g.reset_index(), {"tokens_per_s": throughput_text, "peak_memory_bytes": gib,
                                     "tok/s vs first %": str, "memory vs first %": _change},
                   {"tokens_per_s": TOKS, "peak_memory_bytes": "peak memory", "tok/s vs first %": "tok/s vs first",
                    "memory vs first %": "memory vs first"})


def _change(pct: object) -> str:
    """'+133%', '-59%' (as the report's cost table writes a change); '—' where not comparable."""
    return costs.cell(float(pct), "")


def summary(stats_: pd.DataFrame) -> pd.DataFrame:
    """The statistics a reader decides on, one row per arm (strings): mean ± std, Δ, the test made, its p and
    Holm's, the evidence, the Δ interval at its level, and the seeds per arm to resolve."""
    def interval_cell(r: pd.Series) -> str:
        if not (math.isfinite(r["delta_low"]) and math.isfinite(r["delta_high"])):
            return "—"
        return f"[{_bound(r['delta_low'])}, {_bound(r['delta_high'])}] ({r['level']})"

    return pd.DataFrame({
        "arm": stats_["variant"],
        "seeds": [count(n) for n in stats_["seeds"]],
        "eval loss": [loss(m) + (f" ± {loss(s)}" if math.isfinite(s) else "")
                      for m, s in zip(stats_["mean"], stats_["std"], strict=True)],
        "Δ": [delta(d) if i else "—" for i, d in enumerate(stats_["delta"])],
        "test": [text(t) for t in stats_["test"]],
        "p": [p_value(p) for p in stats_["p"]],
        "Holm p": [p_value(p) for p in stats_["holm_p"]],
        "evidence": [text(e) for e in stats_["evidence"]],
        "Δ interval": [interval_cell(r) for _, r in stats_.iterrows()],
        "seeds per arm to resolve": [need_text(n, u, d) if i and e in ("unresolved", "untested") else "—"
                                     for i, (n, u, d, e) in
                                     enumerate(zip(stats_["seeds_needed"], stats_["seeds_at_observed_sd"],
                                                   stats_["seeds_for_test"], stats_["evidence"], strict=True))],
    })


def same_notes(stats_: pd.DataFrame) -> list[str]:
    """A line for each arm that trained another arm's model (:mod:`reports.identity`): why it is not tested."""
    return [f"{arm}: {identity.note(other)}" for arm, other in stats_.attrs.get("same_model", {}).items()]


def both_tests(stats_: pd.DataFrame) -> pd.DataFrame:
    """Welch's test and the paired test of each arm against the first, side by side (strings)."""
    rest = stats_.iloc[1:]
    rest = rest[~rest["variant"].isin(list(stats_.attrs.get("same_model", {})))]  # (no test of one model's names)
    return pd.DataFrame({
        "arm": rest["variant"], "Welch t": [_stat(x) for x in rest["welch_t"]],
        "Welch p": [p_value(x) for x in rest["welch_p"]], "pairs": [count(n) for n in rest["paired_n"]],
        "paired t": [_stat(x) for x in rest["paired_t"]], "paired p": [p_value(x) for x in rest["paired_p"]],
    })


def compare_markdown(aligned: pd.DataFrame, stats_: pd.DataFrame, diff: pd.DataFrame, costs: pd.DataFrame,
                     step: int, scope: object = None) -> str:
    """All comparison tables as one markdown document (the data in them escaped: :mod:`reports.escape`)."""
    same = same_notes(stats_)
    return "\n".join([
        f"# Comparison: {cell_text(' vs '.join(stats_['variant']))}\n",
        *([f"Scope: {cell_text(scope.label())}.\n"] if scope is not None else []),
        "## Eval loss at common steps (seed mean)\n", _table(aligned), "",
        f"## Statistics over seeds at step {step:,}\n", STATS_NOTE + "\n",
        markdown_table(summary(stats_), disable_numparse=True), "",
        *[f"- {cell_text(line)}" for line in same], *([""] if same else []),
        "### Both tests\n", markdown_table(both_tests(stats_), disable_numparse=True), "",
        "### Every figure\n", _table(stats_), "",
        "## Config differences\n", markdown_table(diff) if len(diff) else "_(none besides the variant)_", "",
        "## Throughput and memory\n", _table(costs), "",
    ])


def _table(df: pd.DataFrame) -> str:
    """A table by the formats it carries (:func:`reports.numbers.as_text`), numbers right-aligned: as the
    terminal shows it."""
    shown = as_text(df)
    return markdown_table(shown, disable_numparse=True, colalign=shown.attrs["align"])


STATS_NOTE = ("Against the first arm: a paired t-test over the per-seed differences when both arms hold the same "
              "seeds (same seed, same data order), else Welch's; Holm over the arms compared; resolved when Holm's "
              "p ≤ 0.05. The Δ interval is that test's, at the level that agrees with Holm's decision (95% for one "
              "comparison), so it holds 0 exactly when the comparison is unresolved; --plot draws it as the band.")
