"""What a run's speed and memory depend on: the conditions each attempt records, and the machine's load.

A tokens/s figure measures a variant on a machine: the device model, the compute threads per process, the
world size, compilation and the autocast dtype all change it (on one busy CPU the same variant recorded 200 tok/s
with two threads and 4,000 with one). Each attempt records those *conditions* in its run's ``conditions_json``,
and a report divides throughputs only where every run it compares recorded the same ones. Pure values and JSON:
the trainer writes them, the database keeps them, the reports read them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: What a throughput depends on, in the order a report names them; and how the trainer's process started
#: (:data:`PROCESS`), which a CPU's peak memory depends on (it counts the whole process) and no throughput does.
PROCESS = "process"
CONDITIONS = ("device", "world_size", "threads", "compile", "dtype", PROCESS)


UNKNOWN: dict[str, Any] = dict.fromkeys(CONDITIONS)  # an attempt that recorded none (before migration 0008)

#: Beside a set's conditions, once its attempt ended: other processes' mean share of the machine's CPU while it
#: trained (0..1, :class:`attnres.training.recorder.LoadSampler`), and over how many seconds (``load_s``).
LOAD = "load"


def merged(recorded: str | None, now: Mapping[str, Any], trained_before: bool = False) -> str:
    """A run's ``conditions_json`` once an attempt under ``now`` joins it: the list of distinct sets. A run
    that had trained (``trained_before``) without recording any keeps an unknown set for those steps."""
    sets = json.loads(recorded) if recorded else ([UNKNOWN] if trained_before else [])
    entry = {k: now.get(k) for k in CONDITIONS}
    if entry not in [{k: s.get(k) for k in CONDITIONS} for s in sets]:  # (a set's load is no condition)
        sets.append(entry)
    return json.dumps(sets, sort_keys=True)


def with_load(recorded: str, now: Mapping[str, Any], share: float, seconds: float) -> str:
    """``recorded`` (a run's ``conditions_json``) with an attempt's load, ``share`` of the machine over
    ``seconds``, joined to the set of its conditions ``now`` (averaged by seconds with an earlier attempt's)."""
    sets = json.loads(recorded) if recorded else []
    entry = {k: now.get(k) for k in CONDITIONS}
    for s in sets:
        if {k: s.get(k) for k in CONDITIONS} == entry and seconds > 0:
            before = float(s.get(LOAD + "_s") or 0.0) if s.get(LOAD) is not None else 0.0
            total = before + seconds
            mean = ((float(s[LOAD]) * before if before else 0.0) + share * seconds) / total
            s[LOAD], s[LOAD + "_s"] = round(mean, 4), round(total, 1)
    return json.dumps(sets, sort_keys=True)
