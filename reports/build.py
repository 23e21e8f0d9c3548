"""Where the report package meets the database and the disk: the only module of reports/ with I/O.

database (through :mod:`attnres.tracking.reads`) -> DataFrames -> the pure modules of this package
-> markdown and PNG files. The library never imports reports/; reports build on the library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from sqlalchemy import Engine

from attnres.errors import AttnresError
from attnres.tracking.reads import load_results
from attnres.variants import VARIANTS, canonical
from reports import compare as cmp
from reports.document import build_report
from reports.plots import eval_curves, throughput_vs_delta
from reports.stats import ReportError, common_step
from reports.tables import per_variant


def families() -> dict[str, list[str]]:
    """Variant families compared separately at a common step: the reshaped (deep) variants."""
    deep = [v.name for v in VARIANTS.values() if v.depth_mult > 1]
    return {"Deep": deep} if deep else {}


def _writable(path: Path) -> None:
    parent = path.resolve().parent
    if not parent.is_dir():
        raise AttnresError(f"cannot write '{path}': folder '{parent}' does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise AttnresError(f"cannot write '{path}': permission denied")


def write_report(engine: Engine, out: Path, baseline: str = "standard", step: int | None = None,
                 plots: bool = True) -> str:
    """Build the document from the database; write it (and PNGs under ``reports/`` beside it)."""
    _writable(out)
    res = load_results(engine, step=step)
    descriptions = {v.name: v.description for v in VARIANTS.values()}
    figures: dict[str, str] = {}
    try:
        if plots and len(res.runs):
            fig_dir = out.resolve().parent / "reports"
            fig_dir.mkdir(exist_ok=True)
            curves = eval_curves(res.runs, res.evals)
            curves.savefig(fig_dir / "eval_curves.png", dpi=110)
            figures["Eval loss curves"] = "reports/eval_curves.png"
            fam = {v for m in families().values() for v in m}
            shallow = res.runs[~res.runs["variant"].isin(fam)]
            s = step if step is not None else common_step(shallow, res.evals)
            table = per_variant(shallow, res.evals, s)
            if baseline in set(table["variant"]):
                throughput_vs_delta(table, baseline).savefig(fig_dir / "throughput_vs_delta.png", dpi=110)
                figures["Throughput vs eval-loss Δ"] = "reports/throughput_vs_delta.png"
        notes = []
        if len(res.superseded):
            old = ", ".join(f"{r.variant} s{r.seed} (run {r.id})" for r in res.superseded.itertuples())
            notes.append(f"Not compared: {old}, trained by an earlier revision of the variant "
                         "(`attnres variants` lists what changed); launch them again to include them.")
        text = build_report(res.runs, res.evals, descriptions, families(), baseline, step, figures=figures,
                            notes=notes)
    except ReportError as exc:
        raise AttnresError(f"cannot build the report: {exc}") from None
    out.write_text(text)
    return text


@dataclass
class Comparison:
    variants: list[str]
    step: int
    aligned: pd.DataFrame
    stats: pd.DataFrame
    config: pd.DataFrame
    cost: pd.DataFrame

    def markdown(self) -> str:
        return cmp.compare_markdown(self.aligned, self.stats, self.config, self.cost, self.step)


def compare(engine: Engine, variants: list[str], step: int | None = None, plot: Path | None = None) -> Comparison:
    """Compare variants side by side; optionally save the eval-curve overlay to ``plot``."""
    names = [canonical(v) for v in variants]
    if len(set(names)) < 2:
        raise AttnresError("compare needs at least two different variants, e.g. attnres compare standard control_block")
    res = load_results(engine, names, step=step)
    try:
        aligned = cmp.aligned_evals(res.runs, res.evals, names)
        at = step if step is not None else int(aligned["step"].max())
        if at not in set(aligned["step"]):
            raise ReportError(f"not every variant has an eval loss at step {at}")
        result = Comparison(names, at, aligned, cmp.seed_stats(res.runs, res.evals, names, at),
                            cmp.config_diff(res.runs, names), cmp.cost(res.runs, names))
    except ReportError as exc:
        raise AttnresError(f"cannot compare: {exc}") from None
    if plot is not None:
        _writable(plot)
        eval_curves(res.runs, res.evals, names).savefig(plot, dpi=110)
    return result
