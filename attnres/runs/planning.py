"""Planning a launch: the request checked at parse time, then the grid of cells it expands to.

A :class:`LaunchRequest` holds everything ``attnres launch`` was asked, validated before anything
is recorded (bad input is one line, exit 2). :func:`plan` expands it into variant x swept values x seed
cells (``--set lr=1e-3,3e-3``: :mod:`attnres.runs.grid`) and decides for each from the database: run it,
skip it (it finished with the same config, or is queued or running), or continue an interrupted run
of the same config from its checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from attnres import paths, run_settings
from attnres.config import EXPERIMENT_NAME, SEED_RULE, RunConfig, is_seed
from attnres.data.prepare import BUILTIN, ensure_builtin, read_manifest
from attnres.errors import AttnresError
from attnres.runs import DEFAULT_BACKEND, backends, grid
from attnres.runs.backends import Placement
from attnres.runs.ladder import Rung, Size, TokenRule
from attnres.runs.ladder import rungs as rungs_of
from attnres.tracking import states
from attnres.variants.registry import canonical, get_variant, resolve_run

if TYPE_CHECKING:
    from attnres.tracking.run_store import RunStore


def check_seeds(seeds: list[int], name: str = "seed") -> list[int]:
    """``seeds`` if each is a seed by :data:`attnres.config.SEED_RULE` (0 to 2**31 - 1), else one line naming
    the first that is not (``name``: how the message calls it, e.g. ``--seeds``): a negative seed would fail inside
    the trainer (numpy refuses it), a huge one when the run is recorded, after other runs of the grid were."""
    for seed in seeds:
        if not is_seed(seed):
            raise AttnresError(f"bad {name} '{seed}': {SEED_RULE}, e.g. --seeds 42 1337")
    return list(seeds)


@dataclass(frozen=True)
class LaunchRequest:
    """What ``attnres launch`` was asked, checked: see :func:`request`."""

    variants: list[str]
    seeds: list[int]
    preset: str = "tiny"
    overrides: list[str] = field(default_factory=list)
    data: str = "builtin"
    backend: str = DEFAULT_BACKEND
    placement: Placement = field(default_factory=Placement)
    rule: dict | None = None  # early-stop rule: {"baseline", "by", "at_step"}
    force: bool = False
    experiment: str = ""  # "" = the preset's name
    sweep: dict[str, list[str]] = field(default_factory=dict)  # swept setting -> its values (--set k=a,b)
    mirrors: list[str] | None = None  # trackers each run is also sent to (attnres.mirrors); None: the database's
    on_end: list[str] = field(default_factory=list)  # the command run when a run ends (an argument list)
    # a compute ladder's rungs (attnres.runs.ladder): settings that move together (d_model, n_layer, n_head,
    # steps), each rung a cell of its own, crossed with the sweep
    ladder: list[Rung] = field(default_factory=list)

    def swept(self) -> list[dict[str, str]]:
        """Each cell's own values: a ladder rung's and the swept settings' ([{}]: one cell, nothing varies)."""
        rungs = [r.settings for r in self.ladder] or [{}]
        return [rung | cell for rung in rungs for cell in grid.cells(self.sweep)]

    def cells(self) -> list[list[str]]:
        """The overrides of each cell (one cell, the fixed overrides, when nothing is swept)."""
        return [self.overrides + [f"{k}={v}" for k, v in cell.items()] for cell in self.swept()]


#: settings that change how many tokens a step trains on: a ladder's token rule needs them fixed
TOKENS_PER_STEP = frozenset({"batch_size", "grad_accum", "seq_len"})


def request(variants: list[str], seeds: list[int] | None, preset: str = "tiny", steps: int | None = None,
            overrides: list[str] | None = None, data: str = "builtin", backend: str = DEFAULT_BACKEND,
            placement: Placement | None = None, kill_if_worse_than: str | None = None, by: float = 0.1,
            at_step: int | None = None, force: bool = False, experiment: str | None = None,
            mirrors: list[str] | None = None, on_end: str | None = None,
            ladder: tuple[list[Size], TokenRule] | None = None) -> LaunchRequest:
    """Check a launch's arguments (AttnresError, one line) and return the request.

    ``mirrors``: ``--mirror`` specs; none given, the ``ATTNRES_MIRROR`` environment variable's, else the
    database's own (``attnres mirror``), read when the runs are recorded. ``on_end``: a command line, split
    into an argument list as a POSIX shell would (no shell runs it). ``ladder``: the sizes and token rule of a compute
    ladder (:mod:`attnres.runs.ladder`), each size a cell; ``--set`` may not also give its settings.
    """
    if not variants:
        raise AttnresError("name at least one variant (see `attnres variants`)")
    seeds = check_seeds(list(seeds or [42]))
    if len(set(seeds)) != len(seeds):
        raise AttnresError(f"seed list repeats a seed: {' '.join(map(str, seeds))}")
    names = [canonical(v) for v in variants]
    if len(set(names)) != len(names):
        raise AttnresError("variant list names the same variant twice")
    placement = placement or Placement()
    backends.get(backend).check(placement)
    rule = None
    if kill_if_worse_than is not None:
        if at_step is None or at_step < 1:
            raise AttnresError("--kill-if-worse-than needs --at-step N (an eval step)")
        if not (math.isfinite(by) and by >= 0):
            raise AttnresError(f"--by {by}: the margin must be a finite number of at least 0")
        rule = {"baseline": canonical(kill_if_worse_than), "by": by, "at_step": at_step}
    if experiment is not None and not EXPERIMENT_NAME.fullmatch(experiment):
        raise AttnresError(f"--experiment '{experiment}': use 1 to 128 letters, digits, '.', '_' or '-', "
                           "starting with a letter or digit")
    targets = mirror_targets(mirrors)
    command = on_end_command(on_end)
    fixed, sweep = grid.split_sweeps(list(overrides or []) + ([f"steps={steps}"] if steps is not None else []))
    rungs = _ladder(names, preset, fixed, sweep, backends.get(backend).ranks(placement), ladder) if ladder else []
    req = LaunchRequest(names, seeds, preset, fixed, data, backend, placement, rule, force, experiment or "", sweep,
                        targets, command, rungs)
    cells = req.cells()
    for v in names:  # every cell's config resolves (unknown preset or setting: one line now)
        for cell in cells:
            resolve_run(v, preset, seeds[0], cell, data, req.experiment)
    return req


def _ladder(names: list[str], preset: str, fixed: list[str], sweep: dict[str, list[str]], world: int,
            ladder: tuple[list[Size], TokenRule]) -> list[Rung]:
    """A ladder's rungs as cells, after refusing what would make its sizes or token budgets other than asked."""
    from attnres.variants.traits import deep_variants

    deep = set(deep_variants())
    for name in (n for n in names if n in deep):
        raise AttnresError(f"{name} sets its own depth, which a ladder's sizes would override: scale the variants "
                           "of the preset's shape")
    given = {item.partition("=")[0] for item in fixed} | set(sweep)
    for key in sorted(given & {"d_model", "n_layer", "n_head", "steps"}):
        raise AttnresError(f"--set {key}: a ladder sets d_model, n_layer, n_head and steps at each size (its token "
                           "rule gives the steps)")
    for key in sorted(set(sweep) & TOKENS_PER_STEP):
        raise AttnresError(f"--set {key} sweeps how many tokens a step trains on: a ladder's steps come from one "
                           f"token rule, so give one value (--set {key}=VALUE)")
    sizes, rule = ladder
    return rungs_of(sizes, rule, preset, fixed, world)


def mirror_targets(specs: list[str] | None) -> list[str] | None:
    """The mirrors asked for (``--mirror``, else ``ATTNRES_MIRROR``) as specs; None when neither says."""
    from attnres import mirrors

    if specs:
        return mirrors.specs(specs)
    if os.environ.get("ATTNRES_MIRROR", "").strip():
        return mirrors.specs(os.environ["ATTNRES_MIRROR"])
    return None


def on_end_command(command: str | None) -> list[str]:
    """``--on-end`` as an argument list; a command that is not on PATH is refused now, not when the run ends."""
    if command is None:
        return []
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise AttnresError(f"bad --on-end '{command}': {exc}") from None
    if not argv:
        raise AttnresError("--on-end needs a command, e.g. --on-end 'notify-send attnres'")
    if shutil.which(argv[0]) is None:
        raise AttnresError(f"--on-end: command '{argv[0]}' not found (give a path or a command on PATH)")
    # a path is made absolute (the process that records the end may run in another folder); a bare name is
    # looked up on PATH where the command runs (a SLURM node may keep it elsewhere)
    return [os.path.abspath(argv[0]) if os.sep in argv[0] else argv[0], *argv[1:]]


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


def _shell_syntax(command: str) -> list[str]:
    """The shell operators (redirections, pipes, ``&&``, ``;``) and expansions (``$VAR``, backquotes) in a
    command line, outside quotes for the operators."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        found = [t for t in lexer if t and set(t) <= set("();<>|&")]
    except ValueError:
        return []
    found += re.findall(r"\$(?:[A-Za-z_]\w*|\{[^}]*\}|\()|`", command)
    return list(dict.fromkeys(found))


def on_end_warning(command: str | None) -> str | None:
    """What ``--on-end`` will not do, when its line holds shell syntax: the command runs without a shell, so
    redirections, pipes, ``&&`` and ``$VAR`` reach it as plain words. Returns the warning with the ``sh -c``
    form that does what the line says; None for a plain command, or one that already starts a shell."""
    if not command:
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    found = _shell_syntax(command)
    if not words or not found or (os.path.basename(words[0]) in SHELLS and "-c" in words[1:]):
        return None
    # the line to type: single quotes outside keep $VAR for the shell that runs it, not the one launching
    inner = f'sh -c "{command}"' if not set(command) & set("\"'\\`") else shlex.join(["sh", "-c", command])
    return (f"--on-end runs its command without a shell, so {' '.join(found)} reach {words[0]} as plain "
            f"words; for shell syntax start a shell: --on-end {shlex.quote(inner)}")


@dataclass
class PlannedRun:
    cfg: RunConfig
    cell: dict[str, str] = field(default_factory=dict)  # this cell's swept values, as given
    # every --set this cell trains with, fixed and swept, as given (what a plan line shows beside the preset's
    # name: steps, given by --steps too, has its own place there)
    settings: dict[str, str] = field(default_factory=dict)
    skip: str | None = None  # why it will not run (already finished with this config, or active)
    run_id: int | None = None  # an interrupted run of this config, continued from its checkpoint


def plan(store: RunStore | None, req: LaunchRequest) -> list[PlannedRun]:
    """Expand the grid; mark what already finished or runs with the same config (unless forced)."""
    swept = req.swept()
    planned = [PlannedRun(resolve_run(v, req.preset, s, overrides, req.data, req.experiment), cell,
                          _given(overrides))
               for v in req.variants for cell, overrides in zip(swept, req.cells(), strict=True) for s in req.seeds]
    if store is not None and not req.force:
        for cell in planned:
            prior = store.runs_with_config(cell.cfg.config_hash)
            done = [r for r, s in prior if s == states.FINISHED]
            active = [r for r, s in prior if s in states.ACTIVE]
            resumable = [r for r, s in prior if s in states.RESUMABLE]
            if done:
                cell.skip = f"finished as run {done[0]} (use --force to run again)"
            elif active:
                cell.skip = f"already queued or running as run {active[0]}"
            elif resumable:
                cell.run_id = resumable[-1]  # continue the interrupted run from its checkpoint
    return planned


def _given(overrides: list[str]) -> dict[str, str]:
    """A cell's ``KEY=VALUE`` overrides as given, the last of a key winning (as it does in the config); steps
    left out, as the plan line shows the steps a run trains however they were set."""
    items = dict(item.partition("=")[::2] for item in overrides)
    items.pop("steps", None)
    return items


def check_data(name: str, vocab_size: int | None = None, seq_len: int | None = None, batch: int | None = None,
               ranks: int = 1) -> None:
    """Make sure a run's dataset exists before anything starts (the built-in ones are made on demand),
    that the model's vocabulary holds every token id of it, that each split (train, eval) holds at least
    one window of ``seq_len + 1`` tokens, as the trainer reads them (:class:`attnres.data.loader.TokenShards`: a
    window lies within one shard), and that the train split fills one global batch (``batch`` sequences a rank,
    on each of ``ranks``: :class:`attnres.data.loader.TrainLoader`). Read from the manifest's shard sizes: nothing
    is tokenized again."""
    path = ensure_builtin(name) if name in BUILTIN else paths.dataset(name)
    manifest = read_manifest(path)
    if vocab_size is not None and manifest["vocab_size"] > vocab_size:
        raise AttnresError(f"data '{name}' has {manifest['vocab_size']} token ids but the model's vocab_size is "
                           f"{vocab_size}: --set vocab_size={manifest['vocab_size']} or more")
    if seq_len is None:
        return
    # each split's shards, in tokens (TokenShards: a shard of T tokens holds (T - 1) // seq_len windows)
    sizes = {split: [int(s["tokens"]) if "tokens" in s else (path / s["file"]).stat().st_size // 2
                     for s in info["shards"]] for split, info in manifest["splits"].items()}
    longest = {split: max(tokens, default=0) for split, tokens in sizes.items()}
    split = min(longest, key=longest.__getitem__)
    if longest[split] - 1 < seq_len:
        most = f": --set seq_len={longest[split] - 1} at most" if longest[split] > 1 else ""
        raise AttnresError(f"seq_len {seq_len} is longer than data '{name}' allows: a window is seq_len + 1 = "
                           f"{seq_len + 1:,} tokens of one shard, and the longest shard of its {split} split holds "
                           f"{longest[split]:,}{most}")
    if batch is None:
        return
    windows = sum((t - 1) // seq_len for t in sizes["train"] if t > 0)
    if windows < batch * ranks:
        on = f" on each of {ranks} ranks" if ranks > 1 else ""
        raise AttnresError(f"data '{name}' is too short for one batch: its train split holds {windows:,} windows of "
                           f"seq_len + 1 = {seq_len + 1:,} tokens, and a step takes batch_size {batch}{on}: a smaller "
                           "--set seq_len or batch_size, or more data")


def check_request_data(req: LaunchRequest) -> None:
    """:func:`check_data` for every dataset, vocabulary and window length a request's runs would train with: called
    before anything is recorded (and by a dry run), so a run that could not start is refused in one line, not
    recorded as failed."""
    needs = set()
    for v in req.variants:
        for cell in req.cells():
            cfg = resolve_run(v, req.preset, req.seeds[0], cell, req.data, req.experiment)
            needs.add((cfg.data, cfg.model.vocab_size, cfg.model.seq_len, cfg.train.batch_size))
    ranks = backends.get(req.backend).ranks(req.placement)
    for name, vocab, seq_len, batch in sorted(needs):
        check_data(name, vocab, seq_len, batch, ranks)


#: config entries a command gives by its own flags (or that name the run), not by --set
_BY_FLAG = {"variant", "seed", "preset", "experiment", "data", "revision", "steps"}


def reproduce(config_json: str, config_hash: str, preset: str, seed: int, budget: int, experiment: str
              ) -> list[str] | None:
    """:func:`_reproduce`, a list of its own for each caller."""
    items = _reproduce(config_json, config_hash, preset, seed, budget, experiment)
    return None if items is None else list(items)


@lru_cache(maxsize=4096)  # (a plan asks it for every variant of every scope; a config's answer never changes)
def _reproduce(config_json: str, config_hash: str, preset: str, seed: int, budget: int, experiment: str
               ) -> tuple[str, ...] | None:
    """The ``--set`` items with which ``attnres launch --preset P --steps B`` trains a run of this config again
    (any seed): every entry that differs from the preset's, bookkeeping included (log_every, compile, ... are
    in the config hash, which ``run_settings.settings`` leaves out). None when the config was recorded elsewhere (an
    import: its settings are not known), its preset is not in this attnres, or the items would not give back
    its config hash."""
    from attnres.config import flatten, get_preset

    config = json.loads(config_json or "{}")
    if "model" not in config:
        return None
    try:
        get_preset(preset)
        default = resolve_run(str(config["variant"]), preset, 0)
    except AttnresError:
        return None
    leaf = {k.rsplit(".", 1)[-1]: v for k, v in flatten(config).items()}
    base = {k.rsplit(".", 1)[-1]: v for k, v in flatten(json.loads(default.to_json())).items()}
    variant = get_variant(str(config["variant"]))
    if variant.depth_mult != 1 or variant.width_ratio != 1.0:  # its rule applies to the shape given: give that one
        given = get_preset(preset).model
        shape = variant.given(int(leaf["n_layer"]), int(leaf["d_model"]), int(leaf["n_head"]), given.d_model)
        if shape is None:
            return None
        leaf.update(n_layer=shape[0], d_model=shape[1])
        base.update(n_layer=given.n_layer, d_model=given.d_model)
    items = [f"{k}={run_settings.normal(v)}" for k, v in sorted(leaf.items()) if k not in _BY_FLAG and base.get(k) != v]
    try:
        again = resolve_run(str(config["variant"]), preset, seed, [*items, f"steps={budget}"],
                            str(config.get("data")), experiment)
    except AttnresError:
        return None
    return tuple(items) if again.config_hash == config_hash else None


@cache
def git_commit() -> str | None:
    """The commit of the attnres checkout, if it is one (recorded with every run)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
