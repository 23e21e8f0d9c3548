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
and gives no number. Whether a fitted law holds (its lack of fit, a ladder that does not decline, too few sizes
to extrapolate, runs too short for a compute-efficient frontier) is :mod:`reports.scaling_checks`; the
document's text, with what it withholds and why, is :mod:`reports.scaling_doc`.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from attnres.reports import numbers

MIN_SIZES = 4  # three parameters, and one degree of freedom to judge them by
BOOTSTRAP = 400  # replicates: percentile intervals at 95% move by well under their width between draws
LEVEL = 0.95
FIT = ".4g"  # a fitted parameter, a compute in FLOPs
FLOOR_AT_ZERO = 1e-6  # an E this small (a loss in nats) is the fit's bound 0, not a floor it found
EXTRAPOLATE = (10.0, 100.0)  # multiples of the ladder's largest compute the multiplier is also given at


#: the settings a ladder moves from size to size; two runs of a variant differing in any other setting are not
#: points of one curve
LADDER_KEYS = frozenset({"d_model", "n_layer", "n_head", "steps"})
BUDGET = ("steps", "warmup", "tokens", "params")  # what a run trained on (ladder_runs' columns from its config)


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
                compute_of: Mapping[int, float] | None = None,
                budget_of: Mapping[int, Mapping[str, float]] | None = None) -> pd.DataFrame:
    """One row per run with a final eval loss (variant, setting, seed, size, compute in FLOPs, loss): what the fits
    take.

    ``last``: each run's last ``eval_loss`` and ``train_flops`` (the trainer records the compute as it goes);
    ``compute_of``: the compute worked out from the config by this attnres's count (:mod:`attnres.model.flops`),
    which is taken first: runs recorded by an older count (one that counted some variants' depth projections
    twice or too few times) and newer ones then lie on one axis; the recorded figure is for runs whose config
    cannot be read here. Where a
    setting other than the ladder's takes several values within a variant (a swept ``lr``), each value is a curve of
    its own, ``variant@lr=...``, and ``setting`` says which (a variant's curve is compared with the baseline's at the
    same setting). ``budget_of``: each run's ``steps``, ``warmup``, ``tokens`` and non-embedding ``params`` (from
    its config), columns of their own, for :func:`reports.scaling_checks.short_runs`. Runs without a model config,
    a final eval loss or a finite compute are left out; how many is in ``attrs["left_out"]``."""
    from attnres.run_settings import settings, swept_keys

    have = [(run, settings(run.config_json)) for run in runs.itertuples()]
    swept = [k for k in swept_keys([(str(run.variant), s) for run, s in have]) if k not in LADDER_KEYS]
    rows, left_out = [], 0
    for run, values_of in have:
        values = last.get(int(run.id), {})
        compute = (compute_of or {}).get(int(run.id)) or values.get("train_flops")
        loss, size = values.get("eval_loss"), size_of(run.config_json)
        if size is None or loss is None or not compute or not (math.isfinite(loss) and math.isfinite(compute)):
            left_out += 1
            continue
        setting = ",".join(f"{k}={values_of[k]}" for k in swept if k in values_of)
        budget = {k: float(v) for k, v in (budget_of or {}).get(int(run.id), {}).items()}
        rows.append({"variant": str(run.variant) + (f"@{setting}" if setting else ""), "setting": setting,
                     "seed": int(run.seed), "size": size, "compute": float(compute), "loss": float(loss),
                     "run_id": int(run.id)} | {k: budget.get(k, math.nan) for k in BUDGET})
    frame = pd.DataFrame(rows, columns=["variant", "setting", "seed", "size", "compute", "loss", "run_id", *BUDGET])
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
    groups = [g.sort_values("seed", kind="stable") for _, g in mine.groupby("size")]
    if all(len(g) < 2 for g in groups) or bootstrap < 1:
        return fit  # one seed a size: nothing to resample, no interval
    rng = np.random.default_rng(seed)
    # each size's seeds as arrays; a resampled seed is moved away from its size's mean by sqrt(n / (n - 1)):
    # n seeds drawn with replacement spread only (n - 1) / n as much as seeds do, and with 2 to 5 seeds a size
    # the plain percentile intervals held the true parameters in 84-90% of synthetic ladders, not 95%
    # and the seeds' spread is itself a guess from few seeds (dof of them, over all sizes): each replicate scales
    # it by sqrt(dof / χ²_dof), a draw of σ given that guess, so the intervals widen as a t's does over a normal's
    # (without it, 2 seeds a size held the true multiplier 75% of the time: docs/benchmarks.md)
    parts = [(g["compute"].to_numpy(float), g["loss"].to_numpy(float)) for g in groups]
    inflate = [math.sqrt(len(c) / (len(c) - 1)) if len(c) > 1 else 0.0 for c, _ in parts]
    dof = sum(len(c) - 1 for c, _ in parts)
    for _ in range(bootstrap):
        compute, loss = [], []
        spread = math.sqrt(dof / rng.chisquare(dof))
        for (c, y), k in zip(parts, inflate, strict=True):
            pick = rng.integers(0, len(y), len(y))
            compute.append(c[pick])
            loss.append(y.mean() + spread * k * (y[pick] - y.mean()))
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
    (None unless both fits have intervals). The two fits' replicates are drawn independently (see :func:`fits`)
    and combined index by index."""
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
    """Every variant's fit, in the order the variants first appear, each bootstrap from a generator of its own.
    (One generator for all drew the same seeds in a variant's and the baseline's replicates: right if a seed's
    noise were shared between variants, and where it was not, on synthetic ladders of 2 seeds a size, the
    multiplier's interval held the truth 79% of the time instead of 87%; drawn apart, a shared noise only makes
    the interval wider than it need be.)"""
    return {v: fit_variant(runs, v, bootstrap, seed=i) for i, v in enumerate(dict.fromkeys(runs["variant"]))}


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


def fit_table(found: dict[str, Fit], checked: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per variant: points, sizes, E, A, α with their intervals (or why there is no fit); ``checked``:
    a variant's checks in a few words (:func:`reports.scaling_doc.check_note`), the note's first."""
    rows = []
    for f in found.values():
        row = {"variant": f.variant, "runs": f.points, "sizes": f.sizes}
        if f.ok:
            notes = [(checked or {}).get(f.variant, "")] + ([] if f.intervals else ["one seed a size: no interval "
                                                                                   "(add seeds)"])
            if f.e <= FLOOR_AT_ZERO:
                notes.append("E at its bound 0: the ladder shows no floor yet (α is then a pure power law's)")
            outside = [label for key, label in (("e", "E"), ("a", "A"), ("alpha", "α"))
                       if key in f.intervals and not f.intervals[key][0] <= getattr(f, key) <= f.intervals[key][1]]
            if outside:
                notes.append(f"{', '.join(outside)} outside {'its' if len(outside) == 1 else 'their'} bootstrap "
                             "interval: the fit moves with the seeds drawn (add sizes or seeds)")
            row |= {"E": param("e", f.e), "E 95%": _interval(f, "e"), "A": param("a", f.a), "A 95%": _interval(f, "a"),
                    "α": param("alpha", f.alpha), "α 95%": _interval(f, "alpha"),
                    "note": "; ".join(n for n in notes if n)}
        else:
            row |= dict.fromkeys(["E", "E 95%", "A", "A 95%", "α", "α 95%"], numbers.MISSING) | {"note": f.reason}
        rows.append(row)
    return pd.DataFrame(rows)


def ladder_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per size and variant: runs, median training compute, and the eval loss's mean and spread over seeds;
    with the runs' budgets known, their steps (warmup) and tokens per non-embedding parameter (the short-run
    check's figures)."""
    budget = {"steps": ("steps", "median"), "warmup": ("warmup", "median"), "tokens": ("tokens", "median"),
              "params": ("params", "median")} if set(BUDGET) <= set(runs.columns) else {}
    g = runs.groupby(["size", "variant"], sort=False)
    table = g.agg(runs=("loss", "size"), compute=("compute", "median"), mean=("loss", "mean"), sd=("loss", "std"),
                  **budget)
    table = table.reset_index().sort_values(["compute", "variant"], kind="stable")
    out = pd.DataFrame({"size": table["size"], "variant": table["variant"], "runs": table["runs"].astype(int),
                        "compute (FLOPs)": [_num(c) for c in table["compute"]],
                        "eval loss": [numbers.loss(m) + (f" ± {numbers.loss(sd)}" if math.isfinite(sd) else "")
                                      for m, sd in zip(table["mean"], table["sd"], strict=True)]})
    if budget and table["steps"].notna().any():
        out["steps (warmup)"] = [f"{s:.0f} ({w:.0f})" if math.isfinite(s) and math.isfinite(w) else numbers.MISSING
                                 for s, w in zip(table["steps"], table["warmup"], strict=True)]
        out["tokens/param"] = [f"{t / p:.3g}" if math.isfinite(t / p) else numbers.MISSING
                               for t, p in zip(table["tokens"], table["params"], strict=True)]
    return out


def figure(runs: pd.DataFrame, found: dict[str, Fit]) -> object:
    """Loss against compute on log axes: each run a point, each fitted law a line, dashed past the ladder's largest
    compute (to 10× it): an extrapolation."""
    from attnres.reports.plots import plt  # (with its headless backend)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    lo, top = float(runs["compute"].min()), float(runs["compute"].max())
    grid = np.unique(np.append(np.geomspace(lo, top * EXTRAPOLATE[0], 200), top))
    for i, (name, f) in enumerate(found.items()):
        color = f"C{i % 10}"
        mine = runs[runs["variant"] == name]
        ax.scatter(mine["compute"], mine["loss"], color=color, s=18, label=f"{name} ({len(mine)} runs)")
        if f.ok:
            inside = grid <= top
            ax.plot(grid[inside], f.loss(grid[inside]), color=color, lw=1.5,
                    label=f"{name}: E={param('e', f.e)}, α={param('alpha', f.alpha)}")  # (as the table has them)
            beyond = grid >= top
            ax.plot(grid[beyond], f.loss(grid[beyond]), color=color, lw=1.0, ls="--")
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
