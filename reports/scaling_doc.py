"""The scaling study's text: the multiplier table with what it withholds, the Scaling section and its document.

Pure functions (runs and fits in, markdown out). A multiplier is only as good as the two laws it reads, so the
document gives none for a comparison whose laws fail :mod:`reports.scaling_checks`, none past the ladder's
largest compute (its horizon) where a law has too few sizes to be judged there, marks the rest past the horizon
as extrapolations, and says in its own text, with the figures, what the ladder cannot conclude.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from attnres.reports import numbers
from attnres.reports.scaling import BOOTSTRAP, EXTRAPOLATE, MIN_SIZES, Fit, fit_table, fits, ladder_table, multiplier
from attnres.reports.scaling_checks import (
    CHINCHILLA,
    FRONTIER_SHARE,
    LEVEL,
    MIN_DOF,
    WARMUP_SHARE,
    Check,
    check_all,
    short_runs,
)

#: what a withheld cell says, by the check that withheld it (Check.fails / Check.far)
WITHHELD = "withheld"


def _p(p: float) -> str:
    return numbers.p_value(p)


def check_note(c: Check) -> str:
    """A variant's checks in a few words, for the fit table's note."""
    if c.flat:
        return f"no decline with compute (p = {_p(c.slope_p)})"
    if c.misfit:
        return f"the law does not describe this ladder (lack of fit p = {_p(c.lof_p)})"
    said = [f"lack of fit p = {_p(c.lof_p)}" if c.checked else "fit unchecked (it needs 2 seeds at a size)"]
    if c.dof < MIN_DOF:
        said.append(f"{c.dof} residual dof: no extrapolation")
    return "; ".join(said)


def _times(x: float) -> str:
    return "unbounded" if math.isinf(x) else f"{x:.3g}×"


def pairs(runs: pd.DataFrame, found: Mapping[str, Fit], baseline: str) -> list[tuple[str, str]]:
    """(variant, the baseline curve it is compared with): a swept curve against the baseline's at its setting."""
    setting_of = dict(zip(runs["variant"], runs["setting"], strict=True)) if "setting" in runs else {}
    out = []
    for name in found:
        setting = setting_of.get(name, "")
        base = f"{baseline}@{setting}" if setting and f"{baseline}@{setting}" in found else baseline
        if name != base:
            out.append((name, base))
    return out


def extrapolated(k: float) -> str:
    """The column of a multiplier at ``k`` times the ladder's largest compute: past the horizon, and said so."""
    return f"{k:g}× largest (extrapolated)"


def _withheld(checks: Mapping[str, Check], *names: str) -> tuple[str, str]:
    """Why a comparison's multipliers are withheld at the ladder, and past it ('' each where they are not)."""
    have = [checks[n] for n in names if n in checks]
    near = next((c.fails for c in have if c.fails), "")
    return near, near or next((c.far for c in have if c.far), "")


def multiplier_table(runs: pd.DataFrame, found: dict[str, Fit], baseline: str,
                     checks: Mapping[str, Check] | None = None) -> pd.DataFrame:
    """Each variant's compute-equivalent multiplier against the baseline at each ladder size (the variant's own
    compute there) and extrapolated to 10× and 100× the largest compute; '—' where either law is missing,
    'withheld (why)' where either fails a check (:func:`reports.scaling_checks.Check.fails`; past the ladder
    also :func:`~reports.scaling_checks.Check.far`)."""
    checks = check_all(runs, found) if checks is None else checks
    top = float(runs["compute"].max())
    rows = []
    for name, base_name in pairs(runs, found, baseline):
        f, base = found[name], found.get(base_name)
        mine = runs[runs["variant"] == name]
        at = [(str(size), float(g["compute"].median()), False) for size, g in mine.groupby("size", sort=False)]
        at += [(extrapolated(k), top * k, True) for k in EXTRAPOLATE]
        near, far = _withheld(checks, name, base_name)
        row: dict[str, str] = {"variant": name, "against": base_name}
        for label, compute, beyond in at:
            why = far if beyond else near
            if base is None or not base.ok or not f.ok:
                row[label] = numbers.MISSING
            elif why:
                row[label] = f"{WITHHELD} ({why})"
            else:
                value, ci = multiplier(f, base, compute)
                row[label] = _times(value) + (f" [{_times(ci[0])}, {_times(ci[1])}]" if ci else "")
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.drop(columns="against") if not table.empty and (table["against"] == baseline).all() else table


def _names(names: list[str]) -> str:
    return ", ".join(f"**{n}**" for n in names)


def _check_sentences(checks: Mapping[str, Check], found: Mapping[str, Fit]) -> list[str]:
    """A sentence per failed check of a fitted variant; variants that fail one alike share it."""
    lines, alike = [], {}
    for name, c in checks.items():
        if not found[name].ok:
            continue
        smallest, first, largest, last = c.ends
        if c.flat:
            lines.append(f"{_names([name])}: the loss does not fall with compute across the ladder ({first:.3f} at "
                         f"{smallest}, {last:.3f} at {largest}; {c.slope:+.3g} nats a decade of compute, one-sided "
                         f"p = {_p(c.slope_p)} ≥ {LEVEL:g}): A and α are not determined, so its multipliers are "
                         "withheld.")
        elif c.misfit:
            lines.append(f"{_names([name])}: the law does not describe this ladder. Its size means miss the fitted "
                         f"curve by {c.miss:.3g} nats (RMS) where the seeds' own spread is σ = {c.sigma:.3g} (lack "
                         f"of fit F = {c.lof_f:.3g} on {c.dof} and {c.pure_dof} df, p = {_p(c.lof_p)} < {LEVEL:g}): "
                         "its E, A and α are a shape these runs do not follow, so its multipliers are withheld.")
        elif not c.checked:
            alike.setdefault("one seed a size: the law's fit cannot be judged against seed noise, so no multiplier "
                             "past the ladder is given (add a second seed at each size)", []).append(name)
        if not c.fails and c.dof < MIN_DOF:
            alike.setdefault(f"{c.sizes} sizes leave the law {c.dof} residual degree{'s' * (c.dof != 1)} of freedom "
                             f"(sizes − 3 parameters; {MIN_DOF} are needed): too few to judge it past the ladder, "
                             f"so no multiplier past the ladder is given (add sizes: {3 + MIN_DOF} give "
                             f"{MIN_DOF})", []).append(name)
    return lines + [f"{_names(names)}: {said}." for said, names in alike.items()]


def _range(values: pd.Series, spec: str) -> str:
    lo, hi = float(values.min()), float(values.max())
    return f"{lo:{spec}}" if f"{lo:{spec}}" == f"{hi:{spec}}" else f"{lo:{spec}} to {hi:{spec}}"


def short_sentences(runs: pd.DataFrame) -> list[str]:
    """What runs too short for their schedule or their size say about the ladder (nothing when none are)."""
    short = short_runs(runs)
    if short.empty:
        return []
    n, lines = len(runs), []
    warm = short[short["by_warmup"]]
    if not warm.empty:
        share = warm["warmup"] / warm["steps"]
        lines.append(f"{len(warm)} of {n} runs spent {WARMUP_SHARE:.0%} or more of their steps warming the learning "
                     f"rate up ({_range(warm['warmup'], '.0f')} of {_range(warm['steps'], '.0f')} steps, "
                     f"{_range(share, '.0%')}): their loss is the schedule's as much as the model's.")
    few = short[short["by_tokens"]]
    if not few.empty:
        lines.append(f"{len(few)} of {n} runs trained on fewer than {FRONTIER_SHARE * CHINCHILLA:.3g} tokens a "
                     f"non-embedding parameter ({_range(few['tokens_per_param'], '.2g')}, sizes "
                     f"{', '.join(dict.fromkeys(few['size']))}; Chinchilla's compute-optimal ratio is about "
                     f"{CHINCHILLA:g}).")
    lines.append("So the ladder is not on a compute-efficient frontier: its laws describe this recipe's losses, not "
                 "the best loss at each compute, and its multipliers are not the compute-optimal ones a paper's "
                 "(Kimi's 1.25×) are.")
    return lines


def cannot_conclude(runs: pd.DataFrame, found: Mapping[str, Fit], checks: Mapping[str, Check],
                    extrapolating: bool) -> list[str]:
    """The sentences of 'What this ladder cannot conclude': one a failed check, with its figures; ``extrapolating``:
    whether the document gives a multiplier past the ladder."""
    lines = _check_sentences(checks, found)
    if extrapolating:
        lines.append(f"Multipliers at {' and '.join(f'{k:g}×' for k in EXTRAPOLATE)} the largest compute "
                     f"({numbers.num(float(runs['compute'].max()), '.3g')} FLOPs, this ladder's horizon) are "
                     "extrapolations: they hold only if the law goes on past the ladder, which no run here checks "
                     "(a curve that bends there, as a sum of two power laws does, moves them without failing any "
                     "check here).")
    return lines + short_sentences(runs)


def section(runs: pd.DataFrame, baseline: str, figure: str | None = None, bootstrap: int = BOOTSTRAP,
            found: dict[str, Fit] | None = None) -> str:
    """The report's Scaling section in markdown (``found``: the fits, when already made)."""
    if runs.empty:
        return "## Scaling\n\nNo finished run of a ladder in this scope yet (`attnres scale` launches one).\n"
    found = fits(runs, bootstrap) if found is None else found
    checks = check_all(runs, found)
    lines = ["## Scaling", "",
             f"L(C) = E + A·C^(−α) fitted per variant to each finished run's last eval loss against its training "
             f"compute C in FLOPs (6·N·tokens plus attention and the depth attention's own cost); 95% intervals "
             f"from {bootstrap} bootstrap draws over seeds (on synthetic ladders of 2 or 3 seeds a size the "
             f"multiplier's held the truth 94% of the time). A fit needs at least {MIN_SIZES} sizes. Each law is "
             f"checked: with two seeds at a size, the seeds' spread tests how far the size means sit from the curve "
             f"(lack of fit, at {LEVEL:g}), and the loss must fall with compute; a law that fails either gets no "
             f"multiplier, and one with fewer than {MIN_DOF} residual degrees of freedom (sizes − 3) none past the "
             "ladder (`attnres bench scaling` measures these checks on synthetic ladders).", "",
             fit_table(found, {n: check_note(c) for n, c in checks.items()}).to_markdown(index=False), ""]
    bases = [v for v in found if v == baseline or v.startswith(f"{baseline}@")]
    extrapolating = False
    if bases and len(found) == len(bases):
        lines += [f"Only the baseline '{baseline}' is in the ladder: no variant to give a multiplier for "
                  "(`attnres scale` the variants at the same sizes).", ""]
    elif bases:
        table = multiplier_table(runs, found, baseline, checks)
        extrapolating = any(found[v].ok and b in found and found[b].ok and not _withheld(checks, v, b)[1]
                            for v, b in pairs(runs, found, baseline))
        lines += [f"### Compute-equivalent multiplier vs {baseline}", "",
                  "The compute the baseline's curve needs to reach each variant's loss, divided by the variant's "
                  "compute (above 1×: the variant is worth more compute than it costs); 95% bootstrap interval. "
                  "Past the ladder's largest compute a multiplier is an extrapolation, and its column says so.", "",
                  table.to_markdown(index=False), ""]
    else:
        lines += [f"No run of the baseline '{baseline}' in the ladder: no multiplier.", ""]
    caveats = cannot_conclude(runs, found, checks, extrapolating)
    lines += ["### What this ladder cannot conclude", "", *[f"- {c}" for c in caveats], ""] if caveats else []
    if figure:
        lines += [f"![Loss against compute]({figure})", ""]
    return "\n".join(lines)


def document(runs: pd.DataFrame, found: dict[str, Fit], baseline: str, experiment: str, facts: Mapping[str, str],
             figure: str | None = None, bootstrap: int = BOOTSTRAP) -> str:
    """The scaling study of one ladder: where its numbers come from, the ladder's runs, fits and multipliers."""
    lines = [f"# Scaling study: {experiment}", "",
             *[f"- **{k.capitalize()}:** {v}" for k, v in facts.items()], ""]
    if runs.attrs.get("left_out"):
        n = runs.attrs["left_out"]
        lines += [f"{n} finished run{'s' * (n != 1)} left out: no model config (a run imported from elsewhere), no "
                  "final eval loss, or a loss or compute that is not a finite number.", ""]
    if not runs.empty:
        lines += ["## Ladder", "", "Each size's finished runs: median training compute and the last eval loss "
                  "(mean ± standard deviation over seeds).", "", ladder_table(runs).to_markdown(index=False), ""]
    lines.append(section(runs, baseline, figure, bootstrap, found))
    return "\n".join(lines)
