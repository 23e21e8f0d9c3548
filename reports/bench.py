"""``attnres bench report`` and ``attnres bench errors``: the report's speed and its statistics' error rates.

``bench report`` times the document's generation over a synthetic database, in one process.

``bench errors`` measures how often the document calls a comparison resolved when nothing differs.
Each draw is a fresh SQLite database filled through ``attnres import`` with runs whose eval losses share
one distribution (no true difference), then ``attnres report``'s own code writes the document, and the
document's text is read back: its verdicts and its Statistical Evidence table. Three designs:

* **family-wise**: a baseline and ``variants`` variants with ``seeds`` seeds each, one import (one stage);
  the rate of draws in which at least one variant is called resolved must stay at or under α = 0.05
  (and, beside it, the rate plain p < 0.05 per comparison would give);
* **sequential**: one variant against the baseline, two seeds each, then one more seed each per import
  (a new stage, a new look), reporting after each, up to ``looks`` looks, stopping at the first
  "resolved": adding seeds until p < 0.05 must not produce a resolved (beside it, the rate of stopping at
  plain p < 0.05);
* **power** (:mod:`reports.bench_power`): worlds with a known true effect, where the seeds ``attnres next``
  plans are added and the document written again: the power plans deliver against the 0.8 they state.

The family-wise design counts every test of the document (the primary family's and the Interpretation's
contrasts): the chance of any false "resolved" in a document must stay at or under α = 0.05, at 3 seeds and
at 5.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from attnres.bench.synthetic import synthetic_db
from attnres.errors import AttnresError
from attnres.reports.build import write_report
from attnres.tracking.run_store import RunStore
from attnres.variants import traits
from attnres.variants.registry import VARIANTS


def bench_report(runs: int = 200, steps: int = 6000) -> dict[str, float]:
    """Time `attnres report` (without figures, then with) over a synthetic database."""
    if runs < 1 or steps < 1:
        raise AttnresError(f"--runs and --steps must be at least 1 (got {runs}, {steps})")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        t0 = time.perf_counter()
        rows = synthetic_db(url, runs, steps)
        t_fill = time.perf_counter() - t0
        store = RunStore(url)
        t0 = time.perf_counter()
        write_report(store, Path(tmp) / "report.md", plots=False)
        t_report = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_report(store, Path(tmp) / "report.md", plots=True)
        t_plots = time.perf_counter() - t0
    return {"runs": runs, "steps": steps, "metric_rows": rows, "fill_rows_per_s": rows / t_fill,
            "report_s": t_report, "report_with_plots_s": t_plots}


BUDGET = 100


def _rows(variant: str, seeds: list[int], values: list[float]) -> list[dict[str, object]]:
    return [{"variant": variant, "seed": s, "step": step, "key": "eval_loss",
             "value": v + (0.5 if step < BUDGET else 0), "status": "finished", "preset": "tiny", "experiment": "null",
             "total_steps": BUDGET}
            for s, v in zip(seeds, values, strict=True) for step in (BUDGET // 2, BUDGET)]


def evidence_rows(text: str) -> list[dict[str, str]]:
    """The Statistical Evidence table of a document, one dict per row."""
    section = text.split("## Statistical Evidence", 1)[-1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    if len(lines) < 2:
        return []
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(cols, [c.strip() for c in ln.strip("|").split("|")], strict=True)) for ln in lines[2:]]


def verdicts(text: str) -> dict[str, str]:
    """The Cost/Benefit table's verdict per variant."""
    section = text.split("## Cost/Benefit Summary", 1)[-1].split("\n## ", 1)[0]
    out = {}
    for ln in section.splitlines()[4:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if ln.startswith("|") and len(cells) == 5:
            out[cells[0]] = cells[4]
    return out


def resolved_against_baseline(verdict: str) -> bool:
    """A verdict that states its Δ against the baseline resolved (either way): after the dash for most labels,
    after "; vs baseline: " for *Best quality*, whose dash cites its test against the second."""
    return verdict.split(" — ", 1)[-1].startswith("resolved (") or "; vs baseline: resolved (" in verdict


def _report(folder: Path, files: list[pd.DataFrame], processes: bool = False) -> str:
    """Import each file (one stage each) and write the report: in this process through the functions the two
    verbs call, or (``processes``) as ``attnres import`` and ``attnres report`` processes, as a user runs them."""
    db = folder / "runs.db"
    first = len(list(folder.glob("stage-*.csv")))
    paths = []
    for i, frame in enumerate(files, first):
        paths.append(folder / f"stage-{i}.csv")
        frame.to_csv(paths[-1], index=False)
    if processes:
        cli = [sys.executable, "-m", "attnres.cli.main"]
        for path in paths:
            subprocess.run([*cli, "import", str(path), "--db", str(db)], check=True, capture_output=True)
        subprocess.run([*cli, "report", "--out", str(folder / "r.md"), "--no-plots", "--db", str(db)], check=True,
                       capture_output=True)
        return (folder / "r.md").read_text()
    store = RunStore(str(db))
    for path in paths:
        store.import_file(path)
    return write_report(store, folder / "r.md", plots=False)


def _arms() -> tuple[str, list[str]]:
    """The baseline (no trait at all: standard residuals) and the shallow variants, in registry order."""
    plain = next(v for v in VARIANTS if not traits.traits_of(v))
    return plain, [v for v in VARIANTS if v != plain and v not in traits.deep_variants()]


DESIGNS = ("family-wise", "sequential", "power")
FAMILY_SEEDS = (3, 5)


def bench_errors(draws: int = 200, variants: int = 9, seeds: tuple[int, ...] = (),
                 progress: Callable[[str], None] | None = None, processes: bool = False,
                 designs: tuple[str, ...] = (), effects: tuple[float, ...] = ()) -> dict[str, float]:
    """The ``designs`` asked for (default all): :func:`family_wise` at each of ``seeds`` seeds per arm (default
    3 and 5), :func:`sequential` and the power design (:func:`reports.bench_power.power` at ``effects``), their
    figures prefixed with the design."""
    for d in designs:
        if d not in DESIGNS:
            raise AttnresError(f"--design {d}: choose from {', '.join(DESIGNS)}")
    designs = designs or (DESIGNS[:2] if processes else DESIGNS)
    if processes and "power" in designs:
        raise AttnresError("--processes: the family-wise and sequential designs only (--design power runs in this "
                           "process)")
    if any(n < 2 for n in seeds):
        raise AttnresError("--seeds: at least 2 seeds per arm (a test needs a spread)")
    out: dict[str, float] = {}
    for d in designs:
        if d == "family-wise":
            for n in seeds or FAMILY_SEEDS:
                fw = family_wise(draws, variants, n, progress=progress, processes=processes)
                out |= {f"family_wise_{n}_seeds_{k}": v for k, v in fw.items()}
        elif d == "sequential":
            out |= {f"sequential_{k}": v for k, v in sequential(draws, progress=progress, processes=processes).items()}
        else:
            from attnres.reports.bench_power import EFFECTS, power

            out |= {f"power_{k}": v for k, v in power(draws, effects or EFFECTS, progress=progress).items()}
    return out


def family_wise(draws: int = 200, variants: int = 9, seeds: int = 3, sigma: float = 0.01, seed: int = 0,
                progress: Callable[[str], None] | None = None, processes: bool = False) -> dict[str, float]:
    """The rate of draws with at least one variant called resolved, all variants equal to the baseline."""
    base, names = _arms()
    names = names[:variants]
    if len(names) < variants or draws < 1 or seeds < 2:
        raise AttnresError(f"bench errors: at most {len(names)} variants, at least 1 draw and 2 seeds")
    rng = np.random.default_rng(seed)
    hits = any_hits = naive = 0
    for d in range(draws):
        values = {v: 3.0 + rng.normal(0, sigma, seeds) for v in [base, *names]}
        frame = pd.DataFrame([r for v, x in values.items() for r in _rows(v, list(range(1, seeds + 1)), list(x))])
        with tempfile.TemporaryDirectory() as tmp:
            text = _report(Path(tmp), [frame], processes)
            RunStore.forget_all()
        hits += any(resolved_against_baseline(v) for v in verdicts(text).values())
        any_hits += any(r["Evidence"].startswith("resolved") for r in evidence_rows(text))
        naive += any(stats.ttest_ind(values[v], values[base], equal_var=False).pvalue < 0.05 for v in names)
        if progress:
            progress(f"family-wise: draw {d + 1}/{draws}")
    return {"draws": draws, "variants": variants, "seeds": seeds, **_rate("variant_resolved", hits, draws),
            **_rate("any_test_resolved", any_hits, draws), **_rate("plain_p_below_0.05", naive, draws)}


def sequential(draws: int = 200, looks: int = 8, sigma: float = 0.01, seed: int = 1,
               progress: Callable[[str], None] | None = None, processes: bool = False) -> dict[str, float]:
    """The rate of draws in which adding one seed per arm per look, up to ``looks`` looks, ever gives a resolved."""
    rng = np.random.default_rng(seed)
    hits = naive = 0
    plain, names = _arms()
    for d in range(draws):
        base = list(3.0 + rng.normal(0, sigma, looks + 1))
        var = list(3.0 + rng.normal(0, sigma, looks + 1))
        naive += any(stats.ttest_ind(var[: k + 2], base[: k + 2], equal_var=False).pvalue < 0.05 for k in range(looks))
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for k in range(looks):
                seeds = [1, 2] if k == 0 else [k + 2]
                files.append(pd.DataFrame(_rows(plain, seeds, [base[s - 1] for s in seeds])
                                          + _rows(names[0], seeds, [var[s - 1] for s in seeds])))
                text = _report(Path(tmp), files[-1:], processes)
                if any(resolved_against_baseline(v) for v in verdicts(text).values()):
                    hits += 1
                    break
            RunStore.forget_all()
        if progress:
            progress(f"sequential: draw {d + 1}/{draws}")
    return {"draws": draws, "looks": looks, **_rate("ever_resolved", hits, draws),
            **_rate("plain_p_below_0.05_at_some_look", naive, draws)}


def _rate(name: str, hits: int, n: int) -> dict[str, float]:
    lo, hi = proportion_confint(hits, n, alpha=0.05, method="beta")
    return {f"{name}_rate": hits / n, f"{name}_ci_low": float(lo), f"{name}_ci_high": float(hi)
            if math.isfinite(hi) else 1.0}
