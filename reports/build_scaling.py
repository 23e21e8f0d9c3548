"""Where the scaling study meets the database and the disk (``attnres report --scaling``).

The ladder's runs and their last values come from the store; :mod:`reports.scaling` (pure) fits,
:mod:`reports.scaling_checks` judges the fits and :mod:`reports.scaling_doc` writes; this module picks the
experiment, reads from each run's config what it trained on (its steps, warmup, tokens and parameters, and the
compute of runs recorded before the trainer logged it), and writes the document and its figure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from attnres import outputs
from attnres.config import RunConfig
from attnres.errors import AttnresError
from attnres.model.flops import tokens_per_step, training_flops
from attnres.reports import scaling, scaling_doc
from attnres.reports.build import _save, figures_folder, provenance
from attnres.tracking import states
from attnres.tracking.run_store import RunStore
from attnres.variants.describe import model_params
from attnres.variants.registry import superseded_runs


def _from_config(runs: pd.DataFrame) -> dict[int, dict[str, float]]:
    """What each run trained on, from its recorded config and steps: its ``steps``, ``warmup``, ``tokens``,
    non-embedding ``params`` and training FLOPs by this attnres's count (``compute``)."""
    out = {}
    for run in runs.itertuples():
        try:
            cfg = RunConfig.from_dict(json.loads(run.config_json))
        except (TypeError, ValueError, KeyError):
            continue
        steps = int(run.step) if pd.notna(run.step) and run.step else cfg.train.steps
        world = int(run.world_size) if pd.notna(run.world_size) and run.world_size else 1
        params = model_params(cfg.model)["non_embedding"]
        out[int(run.id)] = {"steps": steps, "warmup": cfg.train.warmup, "params": params,
                            "tokens": tokens_per_step(cfg, world) * steps,
                            "compute": training_flops(cfg, params, world, steps)}
    return out


def ladder(store: RunStore, table: pd.DataFrame, experiment: str | None = None) -> tuple[str, pd.DataFrame]:
    """The experiment of the ladder (default: the newest with finished runs at two sizes or more) and its runs
    as the fits take them (:func:`reports.scaling.ladder_runs`); ``table``: the store's run rows."""
    found = scaling.ladder_experiments(table, states.FINISHED)
    if experiment is None:
        if not found:
            raise AttnresError("no experiment holds finished runs at two model sizes or more: launch a ladder with "
                               "`attnres scale VARIANTS --sizes 32x2 64x4 96x4 128x6 --tokens 2M`")
        experiment = found[0]
    runs = table[(table["experiment"] == experiment) & (table["status"] == states.FINISHED)]
    if runs.empty:
        known = ", ".join(found) or "none"
        raise AttnresError(f"experiment '{experiment}' has no finished run (ladders here: {known})")
    old = superseded_runs(list(zip(runs["variant"], runs["config_json"], strict=True)))
    runs = runs.loc[[not o for o in old]]
    ids = runs["id"].astype(int).tolist()
    last = store.latest_values(ids, ["eval_loss", "train_flops"])
    budget = _from_config(runs)
    compute = {i: b["compute"] for i, b in budget.items()}  # (this count first: see scaling.ladder_runs)
    return experiment, scaling.ladder_runs(runs, last, compute, budget)


def write_scaling(store: RunStore, out: Path, baseline: str = "standard", plots: bool = True,
                  experiment: str | None = None, figures: Path | None = None,
                  bootstrap: int = scaling.BOOTSTRAP, refused: dict[str, object] | None = None) -> str:
    """Write the scaling study of one ladder: fits, multipliers and (with ``plots``) the log-log figure.

    ``refused``: the results document's scope options as given (flag -> value); a ladder spans sizes, budgets and
    steps by design, so any of them given is one line, not silently ignored."""
    for flag, value in (refused or {}).items():
        if value is not None and value != []:
            raise AttnresError(f"{flag} picks a scope of the results document; --scaling takes a whole ladder "
                               "(--experiment picks which)")
    outputs.check(out, example="scaling.md")
    folder = figures or figures_folder(out)
    if plots:
        outputs.check(folder, folder=True, inside=("scaling.png",))
    table = store.run_table()
    name, runs = ladder(store, table, experiment)
    found = scaling.fits(runs, bootstrap)
    link = None
    if plots and not runs.empty:
        folder.mkdir(parents=True, exist_ok=True)
        _save(scaling.figure(runs, found), folder / "scaling.png")
        link = (Path(os.path.relpath(folder, out.parent)) / "scaling.png").as_posix()
    source = table[table["experiment"] == name]
    facts = provenance(store, source[source["id"].isin(runs["run_id"])] if not runs.empty else source)
    text = scaling_doc.document(runs, found, baseline, name, facts, link, bootstrap)
    outputs.write_text(out, text)
    return text
