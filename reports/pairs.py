"""Seeds that keep pairs paired: which seeds a plan adds to each arm, so that a comparison tested paired stays paired.

A comparison is tested paired only when its two arms hold the same seeds (:func:`reports.stats.design`); a plan
that added seeds to one arm of it alone would turn its test into Welch's. So arms that hold the same seeds and are
compared with each other form a group, and every arm of a group gets the same new seeds: when the baseline gets
seeds for one comparison, every arm that shares the baseline's seeds gets them too. A planned comparison whose
arms hold different seeds joins their groups, each arm taking the seeds the other holds, so that it becomes paired,
when the seeds the two hold between them fit within ``--max-seeds``. Where a pairing is lost or cannot be made, a
line says which comparison and why. Pure: seed sets in, seeds per arm and the lines that explain them out.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pandas as pd

Pair = tuple[str, str]


def seed_order(runs: pd.DataFrame) -> Iterator[int]:
    """Seeds the scope's variants share most first, then fresh ones (1, 2, ... not used by any run)."""
    counts = Counter(int(s) for s in runs.drop_duplicates(["variant", "seed"])["seed"])
    yield from sorted(counts, key=lambda s: (-counts[s], s))
    yield from (s for s in itertools.count(1) if s not in counts)


def seeds_text(seeds: list[int]) -> str:
    """'42, 1337, 1–6': the seeds in their order, a run of three or more consecutive ones as a range."""
    parts, i = [], 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts += [f"{seeds[i]}–{seeds[j]}"] if j - i >= 2 else [str(s) for s in seeds[i:j + 1]]
        i = j + 1
    return ", ".join(parts)


def _names(pairs: list[Pair], most: int = 3) -> str:
    shown = [f"{a} vs {b}" for a, b in pairs[:most]]
    return ", ".join(shown) + (f" and {len(pairs) - most} more" if len(pairs) > most else "")


@dataclass
class Seeds:
    """What :func:`plan_seeds` decided: the new seeds per arm, the comparisons whose arms get seeds only to stay
    paired, and the lines that say so (and which comparisons lose, or cannot get, their pairing)."""

    picks: dict[str, list[int]] = field(default_factory=dict)
    kept: list[Pair] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _once(pairs: list[Pair]) -> list[Pair]:
    """Each pair once, in its first order (a pair tested twice, e.g. as the top two and as a contrast)."""
    seen: set[frozenset[str]] = set()
    out = []
    for a, b in pairs:
        if frozenset((a, b)) not in seen:
            seen.add(frozenset((a, b)))
            out.append((a, b))
    return out


def _groups(usable: Mapping[str, set[int]], pairs: list[Pair], planned: list[Pair], cap: int
            ) -> tuple[list[set[str]], list[tuple[Pair, int]]]:
    """Arms joined by a paired comparison (the same seeds), then by a planned one whose two groups' seeds fit
    within ``cap``; with the planned comparisons left apart and the seeds their arms hold between them."""
    group = {v: {v} for pair in [*pairs, *planned] for v in pair}

    def held(members: set[str]) -> set[int]:
        return set().union(*(usable.get(v, set()) for v in members))

    def join(a: str, b: str) -> None:
        merged = group[a] | group[b]
        for v in merged:
            group[v] = merged

    for a, b in pairs:
        if usable.get(a) and usable.get(a) == usable.get(b):
            join(a, b)
    apart = []
    for a, b in planned:
        if group[a] is not group[b]:
            both = held(group[a] | group[b])
            if len(both) <= cap:
                join(a, b)
            else:
                apart.append(((a, b), len(both)))
    unique = {id(g): g for g in group.values()}
    return list(unique.values()), apart


def plan_seeds(runs: pd.DataFrame, usable: Mapping[str, set[int]], targets: Mapping[str, int], pairs: list[Pair],
               planned: list[Pair], max_seeds: int, launchable: Mapping[str, bool]) -> Seeds:
    """The new seeds per arm: each arm of a group reaches its group's count (the most any of its arms' planned
    comparisons asks, at least the seeds the group holds) with the same seeds, those the group holds first, then
    the scope's seed order (shared seeds first, then fresh ones), never a seed an arm already tried.

    ``usable``: each arm's seeds that give a value (finished or going); ``targets``: seeds per arm the planned
    comparisons ask; ``pairs``: every comparison the document tests; ``planned``: those the plan resolves;
    ``launchable``: whether a command can train the arm again here (its seeds are planned, not launched, if not).
    """
    out = Seeds()
    pairs = _once(pairs)
    groups, apart = _groups(usable, pairs, planned, max_seeds)
    for members in groups:
        need = max((targets[v] for v in members if v in targets), default=0)
        if not need:
            continue
        tried = set(runs.loc[runs["variant"].isin(members), "seed"].astype(int))
        held = set().union(*(usable.get(v, set()) for v in members))
        first = [s for s in itertools.islice(seed_order(runs), runs["seed"].nunique()) if s in held]
        fresh = (s for s in seed_order(runs) if s not in held and s not in tried)
        final = first + list(itertools.islice(fresh, max(0, need - len(held))))
        for v in sorted(members):
            mine = set(runs.loc[runs["variant"] == v, "seed"].astype(int))
            out.picks[v] = [s for s in final if s not in usable.get(v, set()) and s not in mine]
        # arms that get more seeds than their own planned comparisons ask, to keep the same seeds as the others
        extra = {v: len(usable.get(v, set())) + len(out.picks[v]) - max(targets.get(v, 0), len(usable.get(v, set())))
                 for v in members if out.picks[v] and launchable.get(v, False)}
        pulled = sorted(v for v, n in extra.items() if n > 0)
        drivers = sorted(v for v in members if targets.get(v) == need and out.picks[v])
        kept = [(a, b) for a, b in pairs if {a, b} <= members and {a, b} & set(pulled)]
        out.kept += kept
        if pulled and drivers and kept:
            out.lines.append(
                f"{', '.join(pulled)} {'gets' if len(pulled) == 1 else 'get'} the same new seeds as "
                f"{', '.join(drivers)} ({seeds_text(out.picks[pulled[0]])}), so that {_names(kept)} "
                f"{'is' if len(kept) == 1 else 'are'} tested paired (a seed added to one arm alone would turn a "
                f"paired test into Welch's): {sum(extra[v] for v in pulled)} run(s) more than "
                f"{'its' if len(pulled) == 1 else 'their'} own comparisons ask.")
    after = {v: usable.get(v, set()) | (set(out.picks.get(v, [])) if launchable.get(v, False) else set())
             for pair in pairs for v in pair}
    for a, b in pairs:
        was = bool(usable.get(a)) and usable.get(a) == usable.get(b)
        now = bool(after[a]) and after[a] == after[b]
        if now and not was and usable.get(a) and usable.get(b):
            out.lines.append(f"{a} vs {b} becomes paired: both arms will hold the same {len(after[a])} seeds (each "
                             "takes those of the other's it lacks).")
        elif was and not now:
            out.lines.append(f"{a} vs {b} loses its pairing (then Welch's test over all seeds of each arm): "
                             f"{_why(runs, (a, b), usable, out.picks, launchable)}.")
    for (a, b), n in apart:
        out.lines.append(f"{a} vs {b} stays unpaired (Welch's test): pairing it would take the {n} seeds its arms "
                         f"hold between them, more than --max-seeds {max_seeds} per arm.")
    return out


def _why(runs: pd.DataFrame, pair: Pair, usable: Mapping[str, set[int]], picks: Mapping[str, list[int]],
         launchable: Mapping[str, bool]) -> str:
    """Why the plan cannot add the same seeds to both arms of a paired comparison."""
    for v in pair:
        if picks.get(v) and not launchable.get(v, False):
            return (f"no command here trains {v} again (its runs' settings cannot be reproduced), so only the "
                    "other arm gets new seeds")
    other = {v: set(picks.get(w, [])) - set(picks.get(v, [])) for v, w in (pair, pair[::-1])}
    for v, missing in other.items():
        tried = sorted(missing & set(runs.loc[runs["variant"] == v, "seed"].astype(int)))
        if tried:
            return f"{v} already has a run at seed(s) {seeds_text(tried)} that gave no value (failed or diverged)"
    return "the plan adds different seeds to its arms"
