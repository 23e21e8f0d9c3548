"""Scaling laws over a compute ladder: ``L(C) = E + A · C^(−α)`` per variant, and what it buys against the baseline.

Pure functions: a DataFrame of runs in (one row per finished run: variant, seed, size, compute in FLOPs and the
eval loss it reached), fits, tables and a figure out. The fit is scipy's ``curve_fit`` over every run of a
variant (compute scaled to the ladder's smallest, so the three parameters are of one order); its intervals are
a bootstrap over seeds: each replicate draws, at every size, as many runs as that size has, with replacement,
and is fitted again. The compute-equivalent multiplier of a variant at compute ``C`` is the compute the
baseline's curve needs to reach the variant's loss there, divided by ``C`` (Kimi's *Attention Residuals*
reports 1.25×): ``C_b = (A_b / (L_v(C) − E_b))^(1/α_b)``; where the variant's loss is below the baseline's
floor ``E_b`` no compute reaches it, and the multiplier is unbounded.

A three-parameter law needs at least four sizes (one degree of freedom left); with fewer the section says so
and gives no number.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from reports import numbers

MIN_SIZES = 4  # three parameters, and one degree of freedom to judge them by
BOOTSTRAP = 400  # replicates: percentile intervals at 95% move by well under their width between draws
LEVEL = 0.95
FIT = ".4g"  # a fitted parameter, a compute in FLOPs
FLOOR_AT_ZERO = 1e-6  # an E this small (a loss in nats) is the fit's bound 0, not a floor it found
EXTRAPOLATE = (10.0, 100.0)  # multiples of the ladder's largest compute the multiplier is also given at


#: the settings a ladder moves from size to size; two runs of a variant differing in any other setting are not
#: points of one curve
LADDER_KEYS = frozenset({"d_model", "n_layer", "n_head", "steps"})


def size_of(config_json: object) -> str | None:
    """A recorded run's model size as a ladder names it (``WIDTHxLAYERS``); None without a model config."""
    try:
        model = json.loads(config_json)["model"] if isinstance(config_json, str) and config_json else None
        return f"{int(model['d_model'])}x{int(model['n_layer'])}" if model else None
    except (ValueError, KeyError, TypeError):
        return None


def ladder_experiments(runs: pd.DataFrame, finished: str = "finished") -> list[str]:
    """Experiments where some variant has finished runs at two model sizes or more (a ladder: not a deep variant's
    other shape beside the baseline's), the most recently started first."""
    done = runs[runs["status"] == finished].assign(size=[size_of(c) for c in runs.loc[runs["status"] == finished,
                                                                                       "config_json"]])
    done = done[done["size"].notna()]
    sizes = done.groupby(["experiment", "variant"])["size"].nunique().groupby(level=0).max()
    newest = done.groupby("experiment")["id"].max()
    return [str(e) for e in newest[sizes.reindex(newest.index) >= 2].sort_values(ascending=False).index]


def ladder_note(runs: pd.DataFrame, experiment: str, db: list[str]) -> list[str]:
    """A line for the results document when its experiment is a compute ladder (finished runs at several model
    sizes, each size a cell of that document): the command that writes the scaling study."""
    import shlex

    if experiment not in ladder_experiments(runs):
        return []
    done = runs[runs["status"] == "finished"]
    sizes = max(len({size_of(c) for c in g["config_json"]} - {None}) for _, g in done.groupby("variant"))
    command = shlex.join(["attnres", "report", "--scaling", "--experiment", experiment, *db])
    return [f"Experiment {experiment} is a compute ladder ({sizes} model sizes; this document compares one): "
            f"`{command}` fits L(C) = E + A·C^(−α) per variant over all of them."]


def ladder_runs(runs: pd.DataFrame, last: Mapping[int, Mapping[str, float]],
                compute_of: Mapping[int, float] | None = None) -> pd.DataFrame:
    """One row per run with a final eval loss (variant, setting, seed, size, compute in FLOPs, loss): what the fits
    take.

    ``last``: each run's last ``eval_loss`` and ``train_flops`` (the trainer records the compute as it goes);
    ``compute_of``: the compute worked out from the config, for runs recorded before ``train_flops`` was. Where a
    setting other than the ladder's takes several values within a variant (a swept ``lr``), each value is a curve of
    its own, ``variant@lr=...``, and ``setting`` says which (a variant's curve is compared with the baseline's at the
    same setting). Runs without a model config, a final eval loss or a finite compute are left out; how many is
    in ``attrs["left_out"]``."""
    from attnres.runs.grid import settings, swept_keys

    have = [(run, settings(run.config_json)) for run in runs.itertuples()]
    swept = [k for k in swept_keys([(str(run.variant), s) for run, s in have]) if k not in LADDER_KEYS]
    rows, left_out = [], 0
    for run, values_of in have:
        values = last.get(int(run.id), {})
        compute = values.get("train_flops") or (compute_of or {}).get(int(run.id))
        loss, size = values.get("eval_loss"), size_of(run.config_json)
        if size is None or loss is None or not compute or not (math.isfinite(loss) and math.isfinite(compute)):
            left_out += 1
            continue
        setting = ",".join(f"{k}={values_of[k]}" for k in swept if k in values_of)
        rows.append({"variant": str(run.variant) + (f"@{setting}" if setting else ""), "setting": setting,
                     "seed": int(run.seed), "size": size, "compute": float(compute), "loss": float(loss),
                     "run_id": int(run.id)})
    frame = pd.DataFrame(rows, columns=["variant", "setting", "seed", "size", "compute", "loss", "run_id"])
    frame.attrs["left_out"] = left_out
    return frame


def law(c: np.ndarray, e: float, a: float, alpha: float) -> np.ndarray:
    """``E + A · c^(−α)``."""
    return e + a * np.power(c, -alpha)


@dataclass
class Fit:
    """One variant's fitted law; ``A`` in the units of compute in FLOPs. ``reason`` says why there is none."""

    variant: str
    points: int
    sizes: int
    e: float = math.nan
    a: float = math.nan
    alpha: float = math.nan
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    replicates: list[tuple[float, float, float]] = field(default_factory=list)
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason

    def loss(self, compute: np.ndarray | float) -> np.ndarray:
        return law(np.asarray(compute, dtype=float), self.e, self.a, self.alpha)


def _fit_points(compute: np.ndarray, loss: np.ndarray) -> tuple[float, float, float] | None:
    """(E, A, α) with compute in FLOPs, or None when the least-squares fit does not converge."""
    from scipy.optimize import curve_fit

    scale = float(compute.min())
    c = compute / scale
    low = float(loss.min())
    guess = (max(0.0, low - 0.1 * (float(loss.max()) - low) - 1e-3), max(float(loss.max()) - low, 1e-3), 0.3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (e, a, alpha), _ = curve_fit(law, c, loss, p0=guess, bounds=([0.0, 0.0, 1e-4], [low, np.inf, 5.0]),
                                         maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    if not all(map(math.isfinite, (e, a, alpha))):
        return None
    return float(e), float(a) * scale ** float(alpha), float(alpha)


def fit_variant(runs: pd.DataFrame, variant: str, bootstrap: int = BOOTSTRAP, seed: int = 0) -> Fit:
    """Fit one variant's runs (columns ``compute``, ``loss``, ``size``); intervals from a bootstrap over seeds."""
    mine = runs[runs["variant"] == variant]
    sizes = mine["size"].nunique()
    fit = Fit(variant, len(mine), sizes)
    if sizes < MIN_SIZES:
        fit.reason = (f"{sizes} size{'s' * (sizes != 1)}: too few points for a fit (a three-parameter law needs "
                      f"at least {MIN_SIZES} sizes)")
        return fit
    point = _fit_points(mine["compute"].to_numpy(float), mine["loss"].to_numpy(float))
    if point is None:
        fit.reason = "the least-squares fit did not converge"
        return fit
    fit.e, fit.a, fit.alpha = point
    groups = [g.sort_values("seed", kind="stable") for _, g in mine.groupby("size")]  # (see multiplier)
    if all(len(g) < 2 for g in groups):
        return fit  # one seed a size: nothing to resample, no interval
    rng = np.random.default_rng(seed)
    # each size's seeds as arrays; a resampled seed is moved away from its size's mean by sqrt(n / (n - 1)):
    # n seeds drawn with replacement spread only (n - 1) / n as much as seeds do, and with 2 to 5 seeds a size
    # the plain percentile intervals held the true parameters in 84-90% of synthetic ladders, not 95%
    parts = [(g["compute"].to_numpy(float), g["loss"].to_numpy(float)) for g in groups]
    inflate = [math.sqrt(len(c) / (len(c) - 1)) if len(c) > 1 else 0.0 for c, _ in parts]
    for _ in range(bootstrap):
        compute, loss = [], []
        for (c, y), k in zip(parts, inflate, strict=True):
            pick = rng.integers(0, len(y), len(y))
            compute.append(c[pick])
            loss.append(y.mean() + k * (y[pick] - y.mean()))
        got = _fit_points(np.concatenate(compute), np.concatenate(loss))
        if got is not None:
            fit.replicates.append(got)
    if len(fit.replicates) >= bootstrap // 2:
        arr = np.array(fit.replicates)
        tail = (1 - LEVEL) / 2 * 100
        for i, name in enumerate(("e", "a", "alpha")):
            lo, hi = np.percentile(arr[:, i], [tail, 100 - tail])
            fit.intervals[name] = (float(lo), float(hi))
    return fit


def equivalent_compute(base: tuple, loss: np.ndarray) -> np.ndarray:
    """The compute at which a law (E, A, α) reaches ``loss`` (inf where the loss is at or below E); the parameters
    may be arrays (one law per bootstrap replicate), elementwise with ``loss``."""
    e, a, alpha = base
    gap = np.asarray(loss, dtype=float) - e
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(gap > 0, np.power(a / np.where(gap > 0, gap, 1.0), 1.0 / alpha), np.inf)


def multiplier(variant: Fit, base: Fit, compute: float) -> tuple[float, tuple[float, float] | None]:
    """The variant's compute-equivalent multiplier against the baseline at ``compute``, and its bootstrap interval
    (None unless both fits have intervals). Replicate i of the two fits is paired: both draw with one generator
    seed over their seeds sorted, so where the variants share seeds a replicate resamples the same seeds in both."""
    at = float(equivalent_compute((base.e, base.a, base.alpha), variant.loss(compute)) / compute)
    n = min(len(variant.replicates), len(base.replicates))
    if not (variant.intervals and base.intervals) or n < 2:
        return at, None
    v = np.array(variant.replicates[:n])
    b = np.array(base.replicates[:n])
    eq = equivalent_compute((b[:, 0], b[:, 1], b[:, 2]), law(np.full(n, compute), v[:, 0], v[:, 1], v[:, 2])) / compute
    tail = (1 - LEVEL) / 2 * 100
    big = np.finfo(float).max  # (an unbounded replicate as the largest float: percentiles then never read inf − inf)
    lo, hi = (math.inf if x >= big / 2 else float(x) for x in np.percentile(np.minimum(eq, big), [tail, 100 - tail]))
    return at, (lo, hi)


def fits(runs: pd.DataFrame, bootstrap: int = BOOTSTRAP) -> dict[str, Fit]:
    """Every variant's fit, in the order the variants first appear."""
    return {v: fit_variant(runs, v, bootstrap) for v in dict.fromkeys(runs["variant"])}


def _num(x: float) -> str:
    return numbers.num(x, FIT)


def param(name: str, x: float) -> str:
    """A fitted parameter (or a bound of its interval) as the table and the figure's legend both write it: E at
    or below :data:`FLOOR_AT_ZERO` is its bound, 0 (not a floor the fit found, and no '8.24e-18')."""
    return "0" if name == "e" and x <= FLOOR_AT_ZERO else _num(x)


def _interval(fit: Fit, name: str) -> str:
    lo_hi = fit.intervals.get(name)
    if not lo_hi:
        return numbers.MISSING
    lo, hi = (param(name, x) for x in lo_hi)
    return f"[{lo}, {hi}]"


def fit_table(found: dict[str, Fit]) -> pd.DataFrame:
    """One row per variant: points, sizes, E, A, α with their intervals (or why there is no fit)."""
    rows = []
    for f in found.values():
        row = {"variant": f.variant, "runs": f.points, "sizes": f.sizes}
        if f.ok:
            notes = [] if f.intervals else ["one seed a size: no interval (add seeds)"]
            if f.e <= FLOOR_AT_ZERO:
                notes.append("E at its bound 0: the ladder shows no floor yet (α is then a pure power law's)")
            outside = [label for key, label in (("e", "E"), ("a", "A"), ("alpha", "α"))
                       if key in f.intervals and not f.intervals[key][0] <= getattr(f, key) <= f.intervals[key][1]]
            if outside:
                notes.append(f"{', '.join(outside)} outside {'its' if len(outside) == 1 else 'their'} bootstrap "
                             "interval: the fit moves with the seeds drawn (add sizes or seeds)")
            row |= {"E": param("e", f.e), "E 95%": _interval(f, "e"), "A": param("a", f.a), "A 95%": _interval(f, "a"),
                    "α": param("alpha", f.alpha), "α 95%": _interval(f, "alpha"),
                    "note": "; ".join(notes)}
        else:
            row |= dict.fromkeys(["E", "E 95%", "A", "A 95%", "α", "α 95%"], numbers.MISSING) | {"note": f.reason}
        rows.append(row)
    return pd.DataFrame(rows)


def _times(x: float) -> str:
    return "unbounded" if math.isinf(x) else f"{x:.3g}×"


def multiplier_table(runs: pd.DataFrame, found: dict[str, Fit], baseline: str) -> pd.DataFrame:
    """Each variant's compute-equivalent multiplier against the baseline at each ladder size (the variant's own
    compute there) and extrapolated to 10× and 100× the largest compute; '—' where either law is missing."""
    rows = []
    setting_of = dict(zip(runs["variant"], runs["setting"], strict=True)) if "setting" in runs else {}
    for name, f in found.items():
        setting = setting_of.get(name, "")
        mine_base = f"{baseline}@{setting}" if setting and f"{baseline}@{setting}" in found else baseline
        if name == mine_base:
            continue
        base = found.get(mine_base)  # (a swept curve against the baseline's at the same setting)
        mine = runs[runs["variant"] == name]
        at = {str(size): float(g["compute"].median()) for size, g in mine.groupby("size", sort=False)}
        top = float(runs["compute"].max())
        at |= {f"{k:g}× largest": top * k for k in EXTRAPOLATE}
        row: dict[str, str] = {"variant": name, "against": mine_base}
        for label, compute in at.items():
            if base is None or not base.ok or not f.ok:
                row[label] = numbers.MISSING
                continue
            value, ci = multiplier(f, base, compute)
            row[label] = _times(value) + (f" [{_times(ci[0])}, {_times(ci[1])}]" if ci else "")
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.drop(columns="against") if not table.empty and (table["against"] == baseline).all() else table


def ladder_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per size and variant: runs, median training compute, and the eval loss's mean and spread over seeds."""
    g = runs.groupby(["size", "variant"], sort=False)
    table = g.agg(runs=("loss", "size"), compute=("compute", "median"), mean=("loss", "mean"), sd=("loss", "std"))
    table = table.reset_index()
    table["order"] = table["compute"]
    table = table.sort_values(["order", "variant"], kind="stable").drop(columns="order")
    return pd.DataFrame({"size": table["size"], "variant": table["variant"], "runs": table["runs"].astype(int),
                         "compute (FLOPs)": [_num(c) for c in table["compute"]],
                         "eval loss": [numbers.loss(m) + (f" ± {numbers.loss(sd)}" if math.isfinite(sd) else "")
                                       for m, sd in zip(table["mean"], table["sd"], strict=True)]})


def section(runs: pd.DataFrame, baseline: str, figure: str | None = None, bootstrap: int = BOOTSTRAP,
            found: dict[str, Fit] | None = None) -> str:
    """The report's Scaling section in markdown (``found``: the fits, when already made)."""
    if runs.empty:
        return "## Scaling\n\nNo finished run of a ladder in this scope yet (`attnres scale` launches one).\n"
    found = fits(runs, bootstrap) if found is None else found
    lines = ["## Scaling", "",
             f"L(C) = E + A·C^(−α) fitted per variant to each finished run's last eval loss against its training "
             f"compute C in FLOPs (6·N·tokens plus attention and the depth attention's own cost); 95% intervals "
             f"from {bootstrap} bootstrap draws over seeds (on synthetic ladders of 2-5 seeds a size they held the "
             f"true parameters 85-93% of the time: read them as a little narrow). A fit needs at least {MIN_SIZES} "
             "sizes.", "",
             fit_table(found).to_markdown(index=False), ""]
    bases = [v for v in found if v == baseline or v.startswith(f"{baseline}@")]
    if bases and len(found) == len(bases):
        lines += [f"Only the baseline '{baseline}' is in the ladder: no variant to give a multiplier for "
                  "(`attnres scale` the variants at the same sizes).", ""]
    elif bases:
        lines += [f"### Compute-equivalent multiplier vs {baseline}", "",
                  "The compute the baseline's curve needs to reach each variant's loss, divided by the variant's "
                  "compute (above 1×: the variant is worth more compute than it costs); 95% bootstrap interval.", "",
                  multiplier_table(runs, found, baseline).to_markdown(index=False), ""]
    else:
        lines += [f"No run of the baseline '{baseline}' in the ladder: no multiplier.", ""]
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


def figure(runs: pd.DataFrame, found: dict[str, Fit]) -> object:
    """Loss against compute on log axes: each run a point, each fitted law a line (extended to 10× the ladder)."""
    from reports.plots import plt  # (with its headless backend)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    lo, hi = float(runs["compute"].min()), float(runs["compute"].max()) * EXTRAPOLATE[0]
    grid = np.geomspace(lo, hi, 200)
    for i, (name, f) in enumerate(found.items()):
        color = f"C{i % 10}"
        mine = runs[runs["variant"] == name]
        ax.scatter(mine["compute"], mine["loss"], color=color, s=18, label=f"{name} ({len(mine)} runs)")
        if f.ok:
            ax.plot(grid, f.loss(grid), color=color, lw=1.5,
                    label=f"{name}: E={param('e', f.e)}, α={param('alpha', f.alpha)}")  # (as the table has them)
    from matplotlib.ticker import FormatStrFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(FormatStrFormatter("%.2f"))  # losses as numbers, not powers of ten
    ax.set_xlabel("training compute (FLOPs)")
    ax.set_ylabel("eval loss")
    ax.set_title("Scaling: L(C) = E + A·C^(−α)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
