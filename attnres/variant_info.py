"""What ``attnres variants`` shows: each variant's description, revision, depth sources and parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnres.errors import AttnresError
from attnres.variants import ALIASES, VARIANTS, resolve_run

if TYPE_CHECKING:
    from attnres.model import GPT


def depth_sources(model: GPT) -> list[int]:
    """How many sources each depth-attention site attends to ([] for the standard residual)."""
    plan = getattr(model.residual, "source_plan", None)
    return [len(sources) for sources in plan()] if plan else []


PARAM_COLUMNS = ["step queries", "readout query", "key gains", "other"]
PARAMS_NOTE = ("Depth-attention parameters. step queries: those of the layers' (or sublayers') sites, "
               "low-rank query factors included; readout query: the mix before the final norm has a query "
               "of its own (block_mqa_depth shares its one query with it); key gains: the key norm's gains; "
               "other: ALiBi slopes, the value projection; depth: their sum; total: the whole model. "
               "sources: how many tensors a site attends over (fewest-most). The first layer's site attends "
               "to the embedding alone, so its query row has no effect.")


def variant_rows(preset: str | None) -> list[dict[str, object]]:
    """Name, description, revision, depth sources (min-max over sites) and, at a preset, parameters."""
    import torch

    from attnres.model import GPT

    aliases = {v: [a for a, t in ALIASES.items() if t == v] for v in VARIANTS}
    rows = []
    for name, v in VARIANTS.items():
        try:
            cfg = resolve_run(name, preset or "tiny", 0).model
        except AttnresError as exc:  # a deep variant on a preset that is already deep
            rows.append({"variant": name, "shape": "refused", "sources": "—", **dict.fromkeys(PARAM_COLUMNS, "—"),
                         "depth": "—", "total": f"{exc}".split(": ")[-1]})
            continue
        with torch.device("meta"):
            model = GPT(cfg)
        counts = depth_sources(model)
        params = model.num_params()
        sources = f"{min(counts)}-{max(counts)}" if counts else "all"
        if preset:  # a parameter table: the descriptions and aliases are in the plain listing
            split = model.residual.param_counts() if hasattr(model.residual, "param_counts") else {}
            row: dict[str, object] = {"variant": name, "shape": f"{cfg.n_layer}L d{cfg.d_model}", "sources": sources}
            for key in PARAM_COLUMNS:
                row[key] = f"{split[key]:,}" if split else "—"
            row["depth"] = f"{params['residual_extra']:,}"
            row["total"] = f"{params['total'] / 1e6:,.1f}M"
        else:
            row = {"variant": name + (f" ({', '.join(aliases[name])})" if aliases[name] else ""),
                   "rev": v.revision, "description": v.description, "depth sources": sources,
                   "extra params": f"{params['residual_extra']:,}"}
        rows.append(row)
    return rows
