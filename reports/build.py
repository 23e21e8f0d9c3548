"""Where the report package meets the database and the disk (with build_scaling.py and bench.py: its I/O).

database (through :mod:`attnres.tracking.report_reads`) -> DataFrames -> the pure modules of this package
-> markdown and PNG files. The library never imports reports/; reports build on the library.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from attnres import outputs, run_settings
from attnres.config import ModelConfig, RunConfig
from attnres.errors import AttnresError
from attnres.reports import costs, studies
from attnres.reports import side_by_side as cmp
from attnres.reports.analysis import Analysis
from attnres.reports.document import Inputs, assemble, bands, report_parts
from attnres.reports.next_plan import KINDS, MAX_SEEDS, Plan
from attnres.reports.scaling import ladder_note
from attnres.reports.scope import LATEST, Asked, Scope, choose, holding, scopes_of, select, select_arms
from attnres.reports.stats import ReportError
from attnres.reports.tables import per_variant
from attnres.reports.tuning import cells_as_arms, tune, tuning_markdown
from attnres.runs.grid import arm_label, parse_arm
from attnres.runs.planning import git_commit, reproduce
from attnres.tracking import Results
from attnres.tracking.run_store import RunStore
from attnres.tracking.states import EARLY
from attnres.variants import traits
from attnres.variants.describe import model_params
from attnres.variants.registry import VARIANTS, canonical, default_settings, resolve_run

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _save(fig: Figure, path: Path) -> None:  # (pyplot is imported where a figure is drawn: --no-plots skips it)
    """Write ``fig`` to ``path`` whole (:func:`attnres.outputs.atomic`): a viewer reloading it never shows half."""
    try:
        with outputs.atomic(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def provenance(store: RunStore, runs: pd.DataFrame, today: dt.date | None = None) -> dict[str, str]:
    """Where the document's numbers come from: date, code, devices, database."""
    commits = sorted({str(c)[:10] for c in runs["git_commit"].dropna()})
    devices = runs["device"].fillna("not recorded").value_counts()
    return {
        "generated": (today or dt.date.today()).isoformat(),
        "attnres commit": (git_commit() or "unknown")[:10],
        "trained at commits": ", ".join(commits) if commits else "not recorded",
        "devices": ", ".join(f"{name} ({n} run{'s' * (n > 1)})" for name, n in devices.items()),
        "database": store.public_url,
    }


def _scoped(table: pd.DataFrame, asked: Asked) -> tuple[pd.DataFrame, Scope, list[Scope]]:
    """The runs of the scope chosen from ``table`` (every run row), the scope, and the database's other scopes."""
    try:
        return select(table, asked.experiment, asked.preset, asked.budget, asked.baseline, asked.data, asked.pick,
                      asked.tuned)
    except ReportError as exc:
        raise AttnresError(str(exc)) from None


def _tuned(res: Results, key: str | None) -> pd.DataFrame | None:
    """Keep each variant's runs at its best value of ``key`` (the table of every value returned), in place."""
    if key is None:
        return None
    try:
        res.runs, table = tune(res.runs, res.evals, key)
    except ReportError as exc:
        raise AttnresError(f"cannot tune: {exc}") from None
    res.evals = res.evals[res.evals["run_id"].isin(res.runs["id"])]
    if not res.maps.empty:
        res.maps = res.maps[res.maps["run_id"].isin(res.runs["id"])]
    return table


def db_args(store: RunStore) -> list[str]:
    """``["--db", URL]`` for the commands a plan prints, unless ``store`` is the default database."""
    return [] if store.is_default else ["--db", store.public_url]


def _model(variant: str, config_json: object, preset: str) -> ModelConfig | None:
    """The model a run trained (its recorded config), or, for a run recorded elsewhere, the variant's model
    at ``preset``; None when neither is known here."""
    config = json.loads(config_json) if isinstance(config_json, str) and config_json else {}
    try:
        if "model" in config:
            return RunConfig.from_dict(config).model
        return resolve_run(variant, preset, 0).model
    except (AttnresError, KeyError, TypeError, ValueError):
        return None


def variant_params(runs: pd.DataFrame, preset: str) -> dict[str, dict[str, int]]:
    """Each variant's parameter counts as its runs trained it (total, non-embedding, ...; built on meta)."""
    out = {}
    for variant, grp in runs.groupby("variant", sort=False):
        model = _model(str(variant), grp["config_json"].iloc[0], preset)
        if model is not None:
            out[str(variant)] = model_params(model)
    return out


def benches_for(stored: pd.DataFrame, runs: pd.DataFrame, preset: str) -> pd.DataFrame:
    """The ``stored`` bench rows that measured these runs' models: the scope's preset, each variant at exactly
    the model config its runs trained (where they recorded one), at their dtype."""
    rows = stored[stored["preset"] == preset].reset_index(drop=True)
    if rows.empty:
        return rows
    models, dtypes = {}, set()
    for variant, grp in runs.groupby("variant", sort=False):
        config = json.loads(grp["config_json"].iloc[0] or "{}")
        if "model" in config:
            models[str(variant)] = json.dumps(config["model"], sort_keys=True)
    for text in runs.get("conditions_json", pd.Series(dtype=object)).dropna():
        dtypes |= {s.get("dtype") for s in json.loads(text)} - {None}
    keep = [models.get(v, m) == m and (not dtypes or d in dtypes)
            for v, m, d in zip(rows["variant"], rows["model_json"], rows["dtype"], strict=True)]
    return rows[keep].reset_index(drop=True)


def bench_args(runs: pd.DataFrame, scope: Scope, baseline: str) -> list[str]:
    """The ``--set`` items that give ``attnres bench`` the runs' model and batch (from a run of the baseline
    trained here; none for runs recorded elsewhere)."""
    mine = runs[runs["variant"] == baseline]
    if mine.empty:
        return []
    run = mine.iloc[0]
    items = reproduce(run["config_json"], run["config_hash"], scope.preset, int(run["seed"]), scope.budget,
                      str(run["experiment"])) or []
    model = {f.name for f in fields(ModelConfig)} - {"residual"}
    return [item for item in items if item.split("=", 1)[0] in model | {"batch_size", "dtype"}]


def launch_plans(frame: pd.DataFrame) -> dict[int, dict]:
    """Launch id -> what ``attnres next`` pre-registered for it (its planned comparisons and seeds), from the
    stages' ``frame``."""
    return {int(i): p for i, p in zip(frame["id"], frame["plan"], strict=True) if p}


def write_report(store: RunStore, out: Path, asked: Asked = LATEST, step: int | None = None, plots: bool = True,
                 max_seeds: int = MAX_SEEDS, figures: Path | None = None) -> str:
    """Build the document of the scope ``asked`` for from the database, at eval ``step`` (None: the final one, or
    the latest the compared variants reached); write it, and its PNGs into ``figures`` (default: a folder named
    after it, beside it), linked from the document by their path relative to it."""
    outputs.check(out, example="attnres-results.md")
    folder = figures or figures_folder(out)
    if plots:
        outputs.check(folder, folder=True, inside=FIGURE_FILES)
    read = store.report_tables()  # the small tables first, together; then the metrics of the runs in scope
    table = read.runs
    runs, scope, others = _scoped(table, asked)
    baseline, tuned = asked.baseline, asked.tuned
    notes = []
    if tuned is not None and baseline not in set(runs["variant"]) and runs["variant"].nunique() == 1:
        runs, baseline, note = _sweep_arms(runs, scope, tuned)
        scope, tuned = replace(scope, tuned=None), None
        notes.append(note)
    _one_variant(runs, scope, others, baseline)
    notes += ladder_note(table[table["experiment"] == scope.experiment], scope.experiment, db_args(store))
    res = store.load_results(step=step, runs=runs)
    table = _tuned(res, tuned)
    if len(res.superseded):
        old = ", ".join(f"{r.variant} s{r.seed} (run {r.id})" for r in res.superseded.itertuples())
        notes.append(f"Not compared: {old}, trained by an earlier revision of the variant "
                     "(`attnres variants` lists what changed); launch them again to include them.")
    inp = Inputs(res.runs, res.evals, scope, {v.name: v.description for v in VARIANTS.values()}, traits.deep_variants(),
                 baseline, step, res.maps, provenance(store, res.runs), notes=notes, others=others,
                 tuning=tuning_markdown(table, tuned) if table is not None else "", plans=launch_plans(read.launches),
                 max_seeds=max_seeds, db=db_args(store), benches=benches_for(read.benchmarks, res.runs, scope.preset),
                 params=variant_params(res.runs, scope.preset), bench_args=bench_args(res.runs, scope, baseline),
                 studies=studies.markdown(read.studies, replace(scope, tuned=None).label()))
    try:
        before, after, analysis = report_parts(inp)  # first the text: bad data fails here, before any file is written
        if plots:
            inp.figures = _figures(inp, folder, analysis, Path(os.path.relpath(folder, out.parent)))
        text = assemble(before, inp.figures, after)
    except ReportError as exc:
        raise AttnresError(f"cannot build the report: {exc}") from None
    outputs.write_text(out, text)
    return text


def _sweep_arms(runs: pd.DataFrame, scope: Scope, key: str) -> tuple[pd.DataFrame, str, str]:
    """A one-variant sweep's values as arms, against the variant's default value of ``key`` (as
    :func:`reports.tuning.cells_as_arms`)."""
    variant = str(runs["variant"].iloc[0])
    try:
        default = default_settings(variant, scope.preset).get(key)
    except (AttnresError, KeyError, ValueError):
        default = None
    try:
        return cells_as_arms(runs, key, default)
    except ReportError as exc:
        raise AttnresError(str(exc)) from None


def _one_variant(runs: pd.DataFrame, scope: Scope, others: list[Scope], baseline: str) -> None:
    """A scope that holds one variant only, swept over a setting, has no baseline to compare against but its
    cells: say how to compare them (``attnres compare VARIANT@KEY=A VARIANT@KEY=B``)."""
    names = set(runs["variant"])
    if baseline in names or len(names) != 1:
        return
    variant = names.pop()
    if scope.tuned:
        values = sorted({run_settings.settings(c).get(scope.tuned) for c in runs["config_json"]} - {None})
        cells = [f"{scope.tuned}={v}" for v in values]
    else:
        base = (scope.experiment, scope.preset, scope.budget, scope.data)
        cells = [scope.cell] + [o.cell for o in others if (o.experiment, o.preset, o.budget, o.data) == base]
        cells = [c for c in cells if c]
    if len(cells) < 2:
        return
    arms = " ".join(f"{variant}@{c.replace(' ', ',')}" for c in cells[:2])
    raise AttnresError(f"no runs of the baseline '{baseline}' in {scope.label()}: only {variant} was run there; "
                       f"compare its settings with `attnres compare {arms}`, or pass --baseline {variant}")


def next_plan(store: RunStore, asked: Asked = LATEST, max_seeds: int = MAX_SEEDS,
              kinds: tuple[str, ...] = KINDS) -> Plan:
    """The What's Next plan of one scope (as its document gives it, for the parts ``kinds``): what ``attnres
    next`` prints and launches. (The analysis it is part of, which ``attnres study`` reads too, is made in
    :mod:`reports.build_study`, which builds on this module.)"""
    from attnres.reports.build_study import next_analysis

    return next_analysis(store, asked, max_seeds, kinds)[1].plan


#: the files :func:`_figures` may write into a document's figures folder (each checked before any work)
FIGURE_FILES = ("delta_curves.png", "throughput_vs_delta.png", "depth_maps.png")


def figures_folder(out: Path) -> Path:
    """Where a document's figures go: a folder named after it, beside it (``results.md`` -> ``results_figures/``),
    so that documents written to one folder never share (and overwrite) each other's figures."""
    return out.parent / f"{out.stem}_figures"


def _figures(inp: Inputs, folder: Path, analysis: Analysis, link: Path) -> dict[str, str | None]:
    """Draw the document's figures into ``folder`` (``link`` from the document): {caption: link}; a figure with
    nothing to show is no file, and the sentence saying why, in its place: {sentence: None}."""
    from attnres.reports import plots  # (pyplot)

    figures: dict[str, str | None] = {}
    intervals = {v: c.ci for v, c in analysis.by_variant.items()}
    fig = plots.delta_curves(inp.runs, inp.evals, inp.baseline, deep=set(inp.deep), bands=bands(analysis))
    if fig is None:
        figures[plots.no_delta(inp.runs, inp.baseline)] = None
    else:
        _save(fig, folder / "delta_curves.png")
        figures["Δ eval loss vs the baseline over steps"] = (link / "delta_curves.png").as_posix()
    shallow = [v for v in sorted(set(inp.runs["variant"])) if v not in inp.deep]
    choice = choose(inp.runs, inp.evals, shallow, inp.baseline, inp.step)
    if choice is not None:
        table = per_variant(inp.runs, inp.evals, choice.step, choice.compared, inp.baseline)
        table = table[table["mark"] == ""]
        ids = [r for ids in table["run_ids"] for r in ids.values()]
        sets = [costs.condition_sets(c) for c in inp.runs.set_index("id").loc[ids, "conditions_json"]]
        # throughputs recorded under different conditions measure the machine: no figure sets them side by side
        if inp.baseline in set(table["variant"]) and costs.speed_alike(sets, [], costs.fields_for(sets)[0]):
            if (fig := plots.throughput_vs_delta(table, inp.baseline, intervals)) is None:
                figures[plots.no_throughput(inp.baseline, choice.step)] = None
            else:
                _save(fig, png := folder / "throughput_vs_delta.png")
                figures[f"Throughput vs eval-loss Δ at step {choice.step:,}"] = (link / png.name).as_posix()
    if not inp.maps.empty:
        named = inp.maps.merge(inp.runs[["id", "variant"]], left_on="run_id", right_on="id")
        last = {v: g[g["step"] == g["step"].max()] for v, g in sorted(named.groupby("variant"), key=lambda kv: kv[0])}
        _save(plots.depth_heatmaps(last), folder / "depth_maps.png")
        figures["Depth-attention maps (last eval)"] = (link / "depth_maps.png").as_posix()
    return figures


@dataclass
class Comparison:
    variants: list[str]
    step: int
    scope: Scope
    aligned: pd.DataFrame
    stats: pd.DataFrame
    config: pd.DataFrame
    cost: pd.DataFrame
    tuning: pd.DataFrame | None = None  # with --tuned: every value of the setting, the picked ones marked
    also: list[Scope] = field(default_factory=list)  # other scopes holding every compared variant (not compared)

    def markdown(self) -> str:
        text = cmp.compare_markdown(self.aligned, self.stats, self.config, self.cost, self.step, self.scope)
        return text + ("\n" + tuning_markdown(self.tuning, str(self.scope.tuned)) if self.tuning is not None else "")


def compare(store: RunStore, variants: list[str], step: int | None = None, plot: Path | None = None,
            experiment: str | None = None, preset: str | None = None, budget: int | None = None,
            data: str | None = None, pick: dict[str, str] | None = None, tuned: str | None = None) -> Comparison:
    """Compare arms side by side within one scope; optionally save their Δ curves to ``plot``.

    An arm is a variant, or a cell of one (``control_block@lr=1e-3``: :func:`attnres.runs.grid.parse_arm`), so two
    settings of one variant compare as two variants do. ``pick`` (``--set``) chooses a cell of a sweep for every
    arm; ``tuned`` compares each variant at its best value of that setting.
    """
    arms = [(canonical(v), p) for v, p in map(parse_arm, variants)]
    labels = [arm_label(v, p) for v, p in arms]
    if len(set(labels)) < 2:
        raise AttnresError("compare needs two different arms: variants (attnres compare standard control_block) or "
                           "cells of one (attnres compare control_block@lr=1e-3 control_block@lr=3e-3)")
    cells = any(p for _, p in arms)
    if cells and tuned is not None:
        raise AttnresError("--tuned picks each variant's best value itself: name cells with @ or use --tuned, "
                           "not both")
    names = list(dict.fromkeys(v for v, _ in arms))
    if plot is not None:
        outputs.check(plot, option="--plot", example="delta.png")
    all_runs = store.run_table()
    mine = all_runs[all_runs["variant"].isin(names)]
    if mine.empty:
        raise AttnresError(f"no runs of {', '.join(names)}")
    scope, also = None, []
    try:
        if cells:
            runs, scope = select_arms(mine, arms, experiment, preset, budget, data, pick)
        else:
            runs, scope, _ = select(mine, experiment, preset, budget, data=data, pick=pick, tuned=tuned,
                                    members=names)
            runs = runs.assign(arm=runs["variant"])
            also = [s for s in scopes_of(holding(mine, names)) if s != replace(scope, tuned=None)]
        arm_of = dict(zip(runs["id"], runs["arm"], strict=True))
        res = store.load_results(names, step=step, runs=runs.drop(columns="arm"))
        table = _tuned(res, tuned)
        res.runs = res.runs.assign(variant=res.runs["id"].map(arm_of))
        res.runs = res.runs.sort_values("id").drop_duplicates(["variant", "seed"], keep="last")  # a rerun replaces
        res.evals = res.evals[res.evals["run_id"].isin(res.runs["id"])]
        aligned = cmp.aligned_evals(res.runs, res.evals, labels)
        at = step if step is not None else int(aligned["step"].max())
        if at == 0:
            raise ReportError("too early: the arms share no eval after step 0 yet (step 0 is the initialisation, "
                              "not a result); compare again after their first eval" if step is None else
                              "step 0 is the initialisation, before any training: nothing to compare there")
        if at not in set(aligned["step"]):
            raise ReportError(f"not every variant has an eval loss at step {at}")
        stats = cmp.seed_stats(res.runs, res.evals, labels, at)
        result = Comparison(labels, at, scope, aligned, stats, cmp.config_diff(res.runs, labels),
                            cmp.cost(res.runs, labels), table, also)
    except ReportError as exc:
        where = f" (in {scope.label()})" if scope is not None and "no eval loss" in str(exc) else ""
        raise AttnresError(f"cannot compare: {exc}{where}") from None
    if plot is not None:
        levels = stats.attrs["levels"]
        from attnres.reports.plots import delta_curves

        _save(delta_curves(res.runs, res.evals, labels[0], labels, bands={v: (None, levels[v]) for v in labels}),
              plot)
    return result


def inspect(store: RunStore, run_id: int, out: Path, step: int | None = None) -> tuple[int, str]:
    """Draw one run's depth-attention map (at ``step``, default its last) to ``out``; returns (step, summary)."""
    from attnres.reports.depth_maps import matrix, summary

    outputs.check(out, example="depth_map.png")
    runs = store.run_table()
    if run_id not in set(runs["id"]):
        raise AttnresError(f"no run with id {run_id}")
    have = store.depth_steps(run_id)
    run = runs[runs["id"] == run_id].iloc[0]
    if not have:
        why = "standard residuals have no depth attention" if run["variant"] == "standard" else \
            "no depth map recorded (it records one at each eval)"
        raise AttnresError(f"run {run_id} ({run['variant']}): {why}")
    if step is not None and step not in have:
        raise AttnresError(f"run {run_id} has no depth map at step {step}; it has steps {', '.join(map(str, have))}")
    at = have[-1] if step is None else step
    weights = store.depth_maps([run_id], at)
    ended = f", {run['status']}" if run["status"] in EARLY else ""
    from attnres.reports.plots import depth_heatmaps

    _save(depth_heatmaps({f"run {run_id}: {run['variant']} s{run['seed']}, step {at:,}{ended}": weights}), out)
    return at, summary(matrix(weights))
