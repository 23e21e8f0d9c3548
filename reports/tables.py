"""The results document's tables, as DataFrames computed from a run table and an evals table.

Every number says what it is: a mean over n seeds (± their std) or one seed's value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from attnres.reports import identity
from attnres.reports.numbers import DELTA, LOSS, SPREAD, TOKS, TOKS_NOTE, num, throughput_text
from attnres.reports.stats import ReportError, eval_at, mean_ci, shown, versus


def _fmt_seeds(seeds: list[int]) -> str:
    word = "seed" if len(seeds) == 1 else "seeds"
    return f"{len(seeds)} {word} ({', '.join(str(s) for s in seeds)})"


def per_variant(runs: pd.DataFrame, evals: pd.DataFrame, step: int, variants: list[str] | None = None,
                baseline: str | None = None) -> pd.DataFrame:
    """One row per variant at ``step``: seed values, their mean and std, final train loss, throughput,
    memory, and the mark of runs that ended early, or of an arm that trained another's model (never the
    ``baseline``'s: it keeps its name, its twin is marked)."""
    at = eval_at(runs, evals, step)
    if variants is not None:
        at = at[at["variant"].isin(variants)]
    at = at.sort_values("run_id").drop_duplicates(["variant", "seed"], keep="last")  # a rerun replaces its seed
    if at.empty:
        raise ReportError(f"no run has an eval loss at step {step}")
    info = runs.set_index("id")
    train = train_at(evals, info, at)
    rows = []
    for variant, grp in at.groupby("variant", sort=False):
        if (grp["mark"] == "").any():  # a seed that ended early is not averaged with finished ones at another step
            grp = grp[grp["mark"] == ""]
        ids = grp["run_id"].tolist()
        marks = sorted({m for m in grp["mark"] if m})
        mean, std, _, _ = mean_ci(grp["eval"].to_numpy())
        rows.append({
            "variant": variant, "eval": mean, "std": std,
            "values": dict(zip(grp["seed"].astype(int), grp["eval"], strict=True)),
            "run_ids": dict(zip(grp["seed"].astype(int), grp["run_id"], strict=True)),
            "train": train.loc[ids].mean(),
            "seeds": sorted(grp["seed"].astype(int).tolist()),
            "tokens_per_s": info.loc[ids, "tokens_per_s"].mean(),
            "peak_memory_bytes": info.loc[ids, "peak_memory_bytes"].mean(),
            "mark": "; ".join(marks),
        })
    out = pd.DataFrame(rows)
    # (over the whole scope: an arm is one model whatever it is set beside)
    same = identity.same_models(runs, prefer=[baseline] if baseline else [])
    for i, variant in enumerate(out["variant"] if not out.empty else []):
        if variant in same:  # one model under two names: footnoted, and out of every ranking and test
            out.at[i, "mark"] = "; ".join(m for m in (out.at[i, "mark"], identity.note(same[variant])) if m)
    return out


def train_at(evals: pd.DataFrame, info: pd.DataFrame, at: pd.DataFrame) -> pd.Series:
    """Each compared run's train loss at the step its eval loss is taken from (``evals``' ``train`` column), so
    a partial table never sets one run's last train loss beside another's at an earlier step; a frame without
    that column (hand-built) gives the runs' final train loss, as does a run's last step without a train loss logged
    at it (imported curves log the two at different steps)."""
    final = info["final_train_loss"] if "final_train_loss" in info else pd.Series(dtype=float)
    if "train" not in evals:
        return final.reindex(at["run_id"]).astype(float)
    lookup = evals.dropna(subset=["train"]).set_index(["run_id", "step"])["train"]
    lookup = lookup[~lookup.index.duplicated(keep="last")]
    values = []
    for rid, step in zip(at["run_id"], at["eval_step"], strict=True):
        value = float(lookup.get((rid, step), math.nan))
        if not math.isfinite(value) and step >= info.at[rid, "total_steps"]:  # its last step: its last train loss
            value = float(final.get(rid, math.nan))
        values.append(value)
    return pd.Series(values, index=at["run_id"].to_numpy(), dtype=float)


def baseline_row(table: pd.DataFrame, baseline: str) -> pd.Series:
    hit = table[table["variant"] == baseline]
    if hit.empty:
        raise ReportError(f"no runs of the baseline '{baseline}' at this step; run it or pass --baseline")
    return hit.iloc[0]


def value_text(mean: float, std: float, seeds: list[int]) -> str:
    """'2.690 ± 0.006 (mean of 4)' or '2.691 (seed 1337)': the number says what it is."""
    if len(seeds) == 1:
        return f"{mean:{LOSS}} (seed {seeds[0]})"
    return f"{mean:{LOSS}} ± {num(std, LOSS, '?')} (mean of {len(seeds)})"


def completed(table: pd.DataFrame, baseline: str, behind: list[tuple[str, int, int]] | None = None,
              step: int | None = None) -> pd.DataFrame:
    """The main table (markdown-ready strings), best first, marked rows last; ``behind`` (variant,
    seed, step) are runs still in progress, named in their variant's Seeds cell; ``step``: the table is
    partial, at that step (its train loss column is that step's, and says so)."""
    base = baseline_row(table, baseline)
    t = table.assign(delta=table["eval"] - base["eval"], marked=table["mark"] != "")
    t = t.sort_values(["marked", "eval"], kind="stable")
    star = {m: "*" * (i + 1) for i, m in enumerate(dict.fromkeys(m for m in t["mark"] if m))}
    going: dict[str, list[str]] = {}
    for variant, seed, at in behind or []:  # ``at``, not ``step``: the header below names the table's step
        going.setdefault(variant, []).append(f"s{seed} in progress, step {at:,}")
    out = pd.DataFrame({
        "Variant": t["variant"],
        "Eval Loss": [value_text(e, s, seeds) + star.get(m, "")
                      for e, s, seeds, m in zip(t["eval"], t["std"], t["seeds"], t["mark"], strict=True)],
        "Δ vs Baseline": ["—" if v == baseline else f"{shown(d):{DELTA}}"
                          for v, d in zip(t["variant"], t["delta"], strict=True)],
        "Train Loss (final)" if step is None else f"Train Loss @ {step:,}": [
            num(x, LOSS) + (star.get(m, "") if math.isfinite(x) else "")
            for x, m in zip(t["train"], t["mark"], strict=True)],
        "Seeds": [_fmt_seeds(s) + "".join(f"; {g}" for g in going.get(v, []))
                  for v, s in zip(t["variant"], t["seeds"], strict=True)],
        TOKS: [throughput_text(x) for x in t["tokens_per_s"]],
    })
    out.attrs["footnotes"] = [f"{s}{m}." for m, s in star.items()] + [TOKS_NOTE]
    return out.reset_index(drop=True)


def evidence(row: pd.Series, base: pd.Series) -> dict[str, float]:
    """How sure a variant's difference from the baseline is (:func:`reports.stats.versus` of their seeds)."""
    return versus(row["values"], base["values"])


def multi_seed(runs: pd.DataFrame, table: pd.DataFrame, baseline: str, step: int) -> dict[str, pd.DataFrame]:
    """For each variant with >= 2 seeds: per-seed rows, mean, std, 95% CI; its evidence in attrs."""
    train = runs.set_index("id")["final_train_loss"]
    base = baseline_row(table, baseline)
    out: dict[str, pd.DataFrame] = {}
    for row in table[table["mark"] == ""].sort_values("variant").itertuples(index=False):
        row = pd.Series(row._asdict())
        if len(row["seeds"]) < 2:
            continue
        vals = np.array([row["values"][s] for s in row["seeds"]])
        mean, std, lo, hi = mean_ci(vals)
        trains = [float(train.get(row["run_ids"][s], math.nan)) for s in row["seeds"]]
        rows = [{"Seed": str(s), f"Eval Loss @ {step}": f"{row['values'][s]:{LOSS}}", "Final Train Loss": num(tr, LOSS)}
                for s, tr in zip(row["seeds"], trains, strict=True)]
        rows.append({"Seed": "Mean", f"Eval Loss @ {step}": f"{mean:{LOSS}}",
                     "Final Train Loss": num(float(np.nanmean(trains)) if np.isfinite(trains).any() else math.nan,
                                              LOSS)})
        rows.append({"Seed": "Std", f"Eval Loss @ {step}": f"{std:{SPREAD}}", "Final Train Loss": ""})
        rows.append({"Seed": "95% CI", f"Eval Loss @ {step}": f"[{lo:{LOSS}}, {hi:{LOSS}}]", "Final Train Loss": ""})
        frame = pd.DataFrame(rows)
        frame.attrs.update(evidence(row, base) if row["variant"] != baseline else {})
        out[row["variant"]] = frame
    return out


def family(table: pd.DataFrame, baseline: str, label: str = "Shallow",
           params: Mapping[str, Mapping[str, int]] | None = None) -> pd.DataFrame:
    """A comparison group's table against ``baseline`` (named with ``label``), best first; with ``params``
    (variant -> total, non_embedding), each model's parameter difference from the baseline's."""
    base = baseline_row(table, baseline)
    t = table.sort_values("eval", kind="stable")
    twin = dict(zip(t["variant"], [identity.same_as(m) for m in t["mark"]], strict=True))  # one model, two names
    step_col = f"Eval @ {int(table.attrs.get('step', 0))}" if "step" in table.attrs else "Eval"
    out = pd.DataFrame({
        "Model": [f"{label} {v}" if v == baseline else f"{v} (same model as {twin[v]})" if twin[v] else v
                  for v in t["variant"]],
        step_col: [value_text(e, s, seeds) for e, s, seeds in zip(t["eval"], t["std"], t["seeds"], strict=True)],
        f"Δ vs {label} Baseline": ["—" if v == baseline or twin[v] else f"{shown(e - base['eval']):{DELTA}}"
                                   for v, e in zip(t["variant"], t["eval"], strict=True)],
    })
    if params and baseline in params:
        out[f"Parameters vs {label} Baseline"] = [param_diff(params.get(v), params[baseline], v == baseline)
                                                  for v in t["variant"]]
    return out.reset_index(drop=True)


def param_diff(mine: Mapping[str, int] | None, base: Mapping[str, int], is_base: bool) -> str:
    """'757.2M total, 680.0M non-embedding' for the baseline; '+0.1M (+0.0%) total, +22.4M (+3.3%)
    non-embedding' for another model; — where its model is not known."""
    if is_base:
        return f"{base['total'] / 1e6:,.1f}M total, {base['non_embedding'] / 1e6:,.1f}M non-embedding"
    if not mine:
        return "—"
    parts = []
    for key, word in (("total", "total"), ("non_embedding", "non-embedding")):
        d = mine[key] - base[key]
        parts.append(f"{d / 1e6:+,.1f}M ({d / base[key]:+.1%}) {word}")
    return ", ".join(parts)


def ended_step(run: pd.Series) -> int:
    """Where a run ended early (its stop step), or how far it got."""
    return int(run["stop_step"]) if pd.notna(run["stop_step"]) else int(run["step"])


def cause(run: pd.Series, width: int = 160) -> str:
    """Why a run ended, in one line: its message's first line."""
    message = run["message"]
    text = message.strip().splitlines()[0][:width] if isinstance(message, str) and message.strip() else ""
    return text or "no cause recorded"
