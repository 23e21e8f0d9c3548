"""Assemble the results document (markdown) from a run table, an evals table and depth maps.

Pure: DataFrames and plain values in, a markdown string out. The same input always gives the same
text (the date and provenance are given, nothing reads a clock), so a report can be diffed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from attnres.reports import depth_maps, evidence, findings, next_plan
from attnres.reports.analysis import Analysis, analyse
from attnres.reports.escape import cell_text, markdown_table
from attnres.reports.evidence import Comparison
from attnres.reports.scope import Choice, Scope
from attnres.reports.stats import MARKS, PAIRED, STARS_RULE, ReportError
from attnres.reports.tables import baseline_row, cause, completed, ended_step, family, multi_seed
from attnres.reports.verdicts import RULE
from attnres.tracking.states import ACTIVE, EARLY, FINISHED


@dataclass
class Inputs:
    """Everything a document is built from (see :func:`build_report`)."""

    runs: pd.DataFrame  # one scope's runs (reports.scope.select), with final_train_loss, tokens_per_s, ...
    evals: pd.DataFrame  # long: run_id, step, value
    scope: Scope
    descriptions: Mapping[str, str]  # variant -> description, in registry order
    deep: list[str]  # variants compared against the shallow baseline at their own step
    baseline: str = "standard"
    step: int | None = None  # compare the shallow group here instead of choosing
    maps: pd.DataFrame = field(default_factory=pd.DataFrame)  # run_id, step, site, source, weight
    provenance: Mapping[str, str] = field(default_factory=dict)
    figures: Mapping[str, str | None] = field(default_factory=dict)  # caption -> path; a left-out one's why -> None
    notes: list[str] = field(default_factory=list)
    others: list[Scope] = field(default_factory=list)
    tuning: str = ""  # with --tuned: the section saying which value of the setting each variant is compared at
    plans: Mapping[int, dict] = field(default_factory=dict)  # launch id -> what `attnres next` pre-registered
    max_seeds: int = next_plan.MAX_SEEDS  # seeds per arm What's Next asks for at most
    db: list[str] = field(default_factory=list)  # ["--db", URL] for What's Next's commands (not the default db)
    benches: pd.DataFrame = field(default_factory=pd.DataFrame)  # stored `attnres bench` rows of the preset
    params: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # variant -> total, non_embedding
    bench_args: list[str] = field(default_factory=list)  # --set items giving `attnres bench` the runs' model
    studies: str = ""  # the Studies section: how each `attnres study` of the scope ended (reports.studies)


def _md(df: pd.DataFrame) -> str:
    """Every table of the document: its text cells are data (names, devices, causes), escaped here, once."""
    return markdown_table(df, disable_numparse=True) if len(df) else "_(none)_"


def _num(x: float, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def run_summary(runs: pd.DataFrame) -> str:
    """A variant's runs in words: '2 finished; s42 running (step 3,000); s7 failed at step 80'."""
    parts = []
    done = runs[runs["status"] == FINISHED]
    if len(done):
        parts.append(f"{len(done)} finished")
    for run in runs[runs["status"] != FINISHED].sort_values("seed").itertuples():
        at = int(run.stop_step) if run.status in EARLY and pd.notna(run.stop_step) else int(run.step)
        parts.append(f"s{run.seed} {run.status} {'at' if run.status in EARLY else '(step'} {at:,}"
                     + ("" if run.status in EARLY else ")"))
    return "; ".join(parts) or "—"


def header(inp: Inputs) -> str:
    p = dict(inp.provenance)  # (names, devices and the URL are data: escaped, as in the tables)
    lines = [f"Scope: {cell_text(inp.scope.label())}."]
    for key in ("generated", "attnres commit", "trained at commits", "devices", "database"):
        if p.get(key):
            lines.append(f"{key.capitalize()}: {cell_text(p[key])}.")
    return "\n".join(f"- {line}" for line in lines) + "\n"


def variants_section(inp: Inputs) -> str:
    present = set(inp.runs["variant"])
    names = [v for v in inp.descriptions if v in present] + [v for v in sorted(present) if v not in inp.descriptions]
    rows = pd.DataFrame({
        "Variant": names,
        "Description": [inp.descriptions.get(v, inp.descriptions.get(v.split("@")[0], "(not in this attnres's "
                                                                                     "registry)")) for v in names],
        "Parameters": [params_text(inp.params.get(v)) for v in names],
        "Runs": [run_summary(inp.runs[inp.runs["variant"] == v]) for v in names],
    })
    missing = [v for v in inp.descriptions if v not in {p.split("@")[0] for p in present}]  # (a cell: its variant)
    tail = f"\nNot run in this scope: {', '.join(missing)}.\n" if missing else ""
    counted = (f"\nParameters: {_counted_from(inp)}; the output layer is tied to the token embedding, and "
               f"non-embedding leaves the embedding out; `attnres variants --params --preset {inp.scope.preset}` "
               "splits the depth attention's.\n") if inp.params else ""
    return "## Variants\n\n" + _md(rows) + "\n" + counted + tail


def _counted_from(inp: Inputs) -> str:
    """Where the parameter counts come from, saying only what is true: the model the runs trained, or, for a
    variant whose runs were recorded elsewhere (imported without their model), its model at the preset."""
    runs = inp.runs[inp.runs["variant"].isin(list(inp.params))]
    first = runs.groupby("variant", sort=True)["config_json"].agg(lambda c: c.iloc[0]) if "config_json" in runs \
        else pd.Series(dtype=object)  # (the run the counts were taken from: reports.build.variant_params)
    elsewhere = [str(v) for v, c in first.items() if "model" not in _config(c)]
    at = f"the variant's model at preset {inp.scope.preset}"
    if not elsewhere:
        return "as trained"
    if len(elsewhere) == len(first):
        return f"{at} (the runs were recorded elsewhere, without their model)"
    return f"as trained, and for the variants recorded elsewhere ({', '.join(elsewhere)}) {at}"


def _config(text: object) -> dict:
    try:
        config = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def params_text(counts: Mapping[str, int] | None) -> str:
    """'757.2M (680.0M non-embedding)', or — where the model is not known here."""
    if not counts:
        return "—"
    return f"{counts['total'] / 1e6:,.1f}M ({counts['non_embedding'] / 1e6:,.1f}M non-embedding)"


def _where(choice: Choice, budget: int) -> str:
    if choice.asked:
        return f"at step {choice.step:,} of {budget:,} (asked for with --step)"
    if choice.final:
        return f"at step {choice.step:,}, the final step"
    if choice.step == budget:  # the finished runs are compared; the ones still going are named below
        return f"at step {choice.step:,}, the final step, before every run has reached it (see below)"
    return (f"**partial**: at step {choice.step:,} of {budget:,}, the latest step every compared variant has "
            "reached")


def _progress_notes(choice: Choice) -> list[str]:
    notes = []
    if choice.behind:
        notes.append("Still behind (not in the table yet): " + ", ".join(
            f"{v} s{seed} (step {step:,})" for v, seed, step in sorted(choice.behind)) + ".")
    notes += [f"{v} still too early to compare (step ~{step:,})." for v, step in choice.too_early.items()]
    return notes


def main_section(inp: Inputs, a: Analysis) -> str:
    at = None if a.main.step >= inp.scope.budget else a.main.step  # a partial table: train loss at its step
    main = completed(a.table, inp.baseline, a.main.behind, at)
    train = "final train loss" if at is None else f"train loss at step {at:,} (the eval loss's step)"
    text = [f"## Results\n\nEval loss (held-out data) {_where(a.main, inp.scope.budget)}. Lower is better. "
            f"Baseline = {inp.baseline}. Eval loss is the mean ± std over seeds, or the one seed's value; "
            f"Δ is between means; {train} and throughput are means over the same seeds.\n",
            _md(main) + "\n"]
    text += [f"{n}\n" for n in main.attrs["footnotes"] + inp.notes + _progress_notes(a.main)]
    return "\n".join(text)


def ended_section(runs: pd.DataFrame) -> str:
    ended = runs[runs["status"].isin(EARLY)].sort_values(["variant", "seed"])
    if ended.empty:
        return ""
    rows = pd.DataFrame({
        "Variant": ended["variant"], "Seed": ended["seed"].astype(str),
        "Ended": [MARKS[s] for s in ended["status"]],
        "At step": [f"{ended_step(r):,} of {int(r['total_steps']):,}" for _, r in ended.iterrows()],
        "Cause": [cause(r) for _, r in ended.iterrows()],
    })
    return "## Runs That Ended Early\n\n" + _md(rows) + "\n"


def multi_seed_section(tables: Mapping[str, pd.DataFrame], baseline: str, step: int,
                       tests: Mapping[str, Comparison]) -> str:
    if not tables:
        return f"## Multi-Seed Results\n\nNo variant has two or more seeds at step {step:,} yet.\n"
    parts = ["## Multi-Seed Results\n",
             f"Per seed, mean, sample std and the 95% t-interval of the mean, at step {step:,}. Against "
             f"{baseline}: Welch's t-test (≥ 2 seeds on both sides) and the paired t-test over the seeds both have "
             "(the same seed sees the same data order); the evidence is the Statistical Evidence table's (after "
             "family-wise control and sequential testing). Of the two, the evidence makes one: the paired test when "
             "both arms hold the same seeds, else Welch's over every seed of each arm, also when they share some "
             "(a paired test over those alone would leave the others out); each line says which one that is.\n"]
    for variant, table in tables.items():
        a = table.attrs
        parts.append(f"### {variant}\n\n{_md(table)}\n")
        if a:
            c = tests.get(variant)
            welch_note, paired_note = _deciding(a)
            parts.append(
                f"Δ vs {baseline}: {_num(a['delta'], '+.4f')} ({a['n']} vs {a['n_base']} seeds); Welch t = "
                f"{_num(a['t'], '.3f')}, p = {_num(a['p'], '.4f')}{welch_note}; paired over {a['pairs']} shared "
                f"seed(s): Δ {_num(a['paired_delta'], '+.4f')}, t = {_num(a['paired_t'], '.3f')}, p = "
                f"{_num(a['paired_p'], '.4f')}{paired_note}"
                + (f"; evidence: {evidence.evidence_text(c)}.\n" if c else ".\n"))
    return "\n".join(parts)


def _deciding(a: Mapping) -> tuple[str, str]:
    """The notes after a Multi-Seed line's Welch and paired figures saying which of the two the evidence makes
    (:func:`reports.stats.design`): paired when the arms hold the same seeds, else Welch's, shared seeds or not."""
    if a.get("design") == PAIRED:
        return " (shown only)", " (the evidence's test: the arms hold the same seeds)"
    if a.get("pairs"):
        return (f" (the evidence's test: the arms share {a['pairs']} of their seeds, not all)",
                " (shown only: it leaves out the seeds one arm alone holds)")
    return " (the evidence's test)", ""


def deep_section(inp: Inputs, a: Analysis, members: list[str]) -> str:
    if not set(members) & set(inp.runs["variant"]):
        return ""
    head = f"## Deep Variants\n\nDepth-scaled variants against the shallow {inp.baseline} baseline.\n"
    if a.deep_table is None:
        waiting = "; ".join(f"{v} (step ~{s:,})" for v, s in (a.deep.too_early.items() if a.deep else []))
        return head + ("\nNo deep variant has an eval at a step the baseline has yet"
                       + (f": {waiting}" if waiting else "") + ".\n")
    assert a.deep is not None
    text = [head, f"Comparison {_where(a.deep, inp.scope.budget)}.\n",
            _md(family(a.deep_table, inp.baseline, params=inp.params)) + "\n"]
    text += [f"{n}\n" for n in _progress_notes(a.deep)]
    text += [f"{v}: {m}.\n" for v, m in zip(a.deep_table["variant"], a.deep_table["mark"], strict=True)
             if "Same model as" in m]
    return "\n".join(text)


def evidence_section(a: Analysis) -> str:
    if not a.tests:
        return ""
    return ("## Statistical Evidence\n\nEvery test this document makes. " + evidence.METHOD + "\n\n"
            + _md(evidence.table(a.tests)) + "\n")


def cost_section(a: Analysis, baseline: str, devices: pd.Series | None = None) -> str:
    base = baseline_row(a.table, baseline)
    mem = base["peak_memory_bytes"]
    mem_txt = f"{mem / 2**30:.2f} GiB" if isinstance(mem, float) and math.isfinite(mem) else "unknown"
    on_cpu = devices is not None and devices.fillna("").astype(str).str.lower().str.startswith("cpu").any()
    rss = (" On CPU, peak memory is the training process's peak resident set (RSS): the Python runtime, the data "
           "and allocator caches included, not the model's activations alone, so it tells little between "
           "variants; `attnres bench` on a GPU measures allocations.") if on_cpu else ""
    return (f"## Cost/Benefit Summary\n\n{_md(a.verdicts)}\n\nSpeed = change in tok/s vs {baseline} (−: slower). "
            f"Memory = change in peak memory vs {baseline} ({mem_txt}; +: more).{rss} "
            f"{a.verdicts.attrs.get('note', '')}"
            f"\n\n{STARS_RULE}\n\n{RULE}\n")


def maps_section(inp: Inputs) -> str:
    if inp.maps.empty:
        return ""
    parts = ["## Depth-Attention Maps\n",
             "Each AttnRes variant's mean softmax weight, per site, on each source it attends to, over held-out "
             "tokens at its last recorded eval (averaged over its seeds at that step).\n"]
    by_variant = inp.maps.merge(inp.runs[["id", "variant"]], left_on="run_id", right_on="id")
    for variant, grp in sorted(by_variant.groupby("variant"), key=lambda kv: kv[0]):
        last = int(grp["step"].max())
        at = grp[grp["step"] == last]
        m = depth_maps.matrix(at)
        parts.append(f"- **{variant}** (step {last:,}, {at['run_id'].nunique()} run(s), {len(m.index)} sites): "
                     f"{depth_maps.summary(m)}")
    return "\n".join(parts) + "\n"


def build_report(inp: Inputs, title: str = "AttnRes: Attention Over the Residual Stream — Experimental Results") -> str:
    """The whole document for one scope."""
    before, after, _ = report_parts(inp, title)
    return assemble(before, inp.figures, after)


def report_parts(inp: Inputs, title: str = "AttnRes: Attention Over the Residual Stream — Experimental Results",
                 ) -> tuple[list[str], list[str], Analysis]:
    """The document's sections before and after its figures (so figures drawn afterwards need no rebuild), and
    the analysis they state (the figures draw its tests' intervals)."""
    if inp.runs.empty:
        raise ReportError("no runs in this scope: launch some first (attnres launch ...)")
    if inp.baseline not in set(inp.runs["variant"]):
        raise ReportError(f"no runs of the baseline '{inp.baseline}' in {inp.scope.label()}; run it or pass --baseline")
    deep = [v for v in inp.deep if v != inp.baseline]
    a = analyse(inp.runs, inp.evals, inp.scope, inp.baseline, deep, inp.step, inp.plans, inp.max_seeds, inp.db,
                benches=inp.benches, bench_args=inp.bench_args)
    parts = [f"# {title}\n", header(inp), variants_section(inp), inp.tuning, main_section(inp, a),
             ended_section(inp.runs)]
    parts.append(multi_seed_section(multi_seed(inp.runs, a.table, inp.baseline, a.main.step), inp.baseline,
                                    a.main.step, a.by_variant))
    parts += [deep_section(inp, a, deep), evidence_section(a), maps_section(inp), findings.markdown(a.findings),
              cost_section(a, inp.baseline, inp.runs.get("device")), next_plan.markdown(a.plan), inp.studies]
    after = []
    if inp.others:
        after.append("## Other Experiments in This Database\n\nNot in this document (a table never mixes "
                     "experiments, presets, step budgets, datasets or the values of a swept setting):\n\n"
                     + "\n".join(f"- {s.label()}: `attnres report {s.flags()}`" for s in inp.others) + "\n")
    running = inp.runs[inp.runs["status"].isin(ACTIVE)]
    if len(running):
        after.append(f"_{len(running)} run(s) still queued or running: this document is a snapshot._\n")
    return parts, after, a


def bands(a: Analysis) -> dict[str, tuple[list[int], float]]:
    """Per variant tested against the baseline: the runs its test used and the level of its decision, for the Δ
    figure's band (:func:`reports.plots.delta_curves`)."""
    return {v: (c.run_ids, c.ci_level) for v, c in a.by_variant.items()}


def assemble(before: list[str], figures: Mapping[str, str | None], after: list[str]) -> str:
    """The document from its sections and its figures (caption -> relative path; a figure left out for having
    nothing to show: the sentence saying why -> None, written in its place)."""
    shown = ["## Figures\n\n" + "\n\n".join(f"![{name}]({path})" if path else f"_{name}_"
                                              for name, path in figures.items()) + "\n"] if figures else []
    return "\n".join(p for p in [*before, *shown, *after] if p)
