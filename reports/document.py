"""Assemble the results document (markdown) from a run table and an evals table.

Pure: DataFrames and the variant registry in, a markdown string out. The same input always
gives the same text (no clocks, no unordered iteration), so a report can be diffed run to run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from attnres.tracking.states import ACTIVE
from reports.stats import ReportError, common_step
from reports.tables import completed, cost_benefit, family_comparison, multi_seed, per_variant


def _md(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, disable_numparse=True) if len(df) else "_(none)_"


def _num(x: float, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def variants_section(descriptions: Mapping[str, str], present: set[str]) -> str:
    rows = pd.DataFrame({
        "Variant": list(descriptions),
        "Description": list(descriptions.values()),
        "Runs": ["yes" if v in present else "—" for v in descriptions],
    })
    return "## Variants\n\n" + _md(rows) + "\n"


def multi_seed_section(tables: Mapping[str, pd.DataFrame], baseline: str, step: int) -> str:
    if not tables:
        return (f"## Multi-Seed Results\n\nNo variant has two or more seeds at step {step} yet.\n")
    parts = ["## Multi-Seed Results\n",
             "Mean, sample std and the 95% t-interval of the mean per variant; Welch's t-test "
             f"compares its seeds with {baseline}'s (needs ≥2 seeds on both sides). *Seeds to "
             "resolve* is the seeds per arm a two-sample test (α = 0.05, power 0.8) would need to "
             "detect the observed difference, from the observed spread.\n"]
    for variant, table in tables.items():
        a = table.attrs
        parts.append(f"### {variant}\n\n{_md(table)}\n")
        if variant != baseline:
            parts.append(f"Δ vs {baseline}: {_num(a['delta'], '+.4f')}; Welch t = {_num(a['t'], '.3f')}, "
                         f"p = {_num(a['p'], '.4f')} ({a['n_baseline']} baseline seed(s)); "
                         f"seeds to resolve: {_num(a['seeds_needed'], '.0f')}.\n")
    return "\n".join(parts)


def cost_section(table: pd.DataFrame, base: pd.Series, baseline: str) -> str:
    mem = base["peak_memory_bytes"]
    mem_txt = f"{mem / 2**30:.2f} GiB" if not math.isnan(mem) else "unknown"
    rule = ("Quality: one ★ per 0.010 of eval-loss improvement over the baseline, to the nearest half "
            "star, at most five; ☆ means no improvement. Verdict: Δ ≥ 0 is *Not worth it*; of the improving variants "
            "the largest improvement is *Best quality*, the largest improvement per unit of cost "
            "(speed cost % + memory cost %, at least 1) is *Best quality/cost ratio*; the rest are "
            "*Solid* at ≥ 0.020 improvement, else *Modest*. Runs that ended early are left out.")
    return (f"## Cost/Benefit Summary\n\n{_md(table)}\n\nSpeed cost = change in tok/s vs {baseline}. "
            f"Memory cost = change in peak memory vs {baseline} ({mem_txt}).\n\n{rule}\n")


def build_report(runs: pd.DataFrame, evals: pd.DataFrame, descriptions: Mapping[str, str],
                 families: Mapping[str, list[str]], baseline: str = "standard", step: int | None = None,
                 title: str = "AttnRes: Attention Over the Residual Stream — Experimental Results",
                 figures: Mapping[str, str] | None = None, notes: list[str] | None = None) -> str:
    """The whole document. ``families`` maps a label (e.g. 'Deep') to variants compared at a common step;
    ``notes`` are said under the main table (e.g. which runs were left out, and why)."""
    if runs.empty:
        raise ReportError("no runs in the database: launch some first (attnres launch ...)")
    comparable = runs[runs["variant"].isin([v for v in runs["variant"].unique()
                                             if not any(v in m for m in families.values())])]
    step = step if step is not None else common_step(comparable if len(comparable) else runs, evals)
    table = per_variant(comparable if len(comparable) else runs, evals, step)
    main = completed(table, baseline)
    base = table[table["variant"] == baseline].iloc[0]
    parts = [f"# {title}\n", variants_section(descriptions, set(runs["variant"])),
             f"## Completed Experiments\n\nEval loss at step {step} (held-out data). Lower is better. "
             f"Baseline = {baseline}.\n\n{_md(main)}\n"]
    if main.attrs["footnotes"]:
        parts.append("\n".join(main.attrs["footnotes"]) + "\n")
    parts += [f"{note}\n" for note in notes or []]
    in_progress = runs[runs["status"].isin(ACTIVE) & (runs["step"] < step)]
    if len(in_progress):
        parts.append("In progress (not yet at step {}): {}.\n".format(
            step, ", ".join(f"{r.variant} s{r.seed} (step {r.step})" for r in in_progress.itertuples())))
    parts.append(multi_seed_section(multi_seed(comparable, evals, step, baseline), baseline, step))
    for label, members in families.items():
        got = family_comparison(runs, evals, members, baseline)
        if got is None:
            continue
        fam, fstep, notes = got
        parts.append(f"## {label} Variants\n\nComparison at step {fstep} eval loss against the "
                     f"{baseline} baseline.\n\n{_md(fam)}\n" + "".join(f"\n{n}\n" for n in notes))
    parts.append(cost_section(cost_benefit(table, baseline), base, baseline))
    if figures:
        parts.append("## Figures\n\n" + "\n\n".join(f"![{name}]({path})" for name, path in figures.items()) + "\n")
    return "\n".join(parts)
