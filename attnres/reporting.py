"""Write the results document and its figures: database -> DataFrames -> reports -> files."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine

from attnres.errors import AttnresError
from attnres.results import load_results
from attnres.variants import VARIANTS
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
    res = load_results(engine)
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
        text = build_report(res.runs, res.evals, descriptions, families(), baseline, step, figures=figures)
    except ReportError as exc:
        raise AttnresError(f"cannot build the report: {exc}") from None
    out.write_text(text)
    return text
