"""The SLURM backend: one sbatch job per run, ``srun torchrun`` with a c10d rendezvous across nodes.

The job is requeueable; a requeued (preempted) job starts the trainer again, which continues
from the run's last checkpoint. The database records the job id; poll and kill go through
``squeue`` and ``scancel``. For jobs that span machines, point ``--db`` at PostgreSQL.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from attnres import paths
from attnres.errors import AttnresError
from attnres.runs.backends import ALIVE, GONE, UNKNOWN, Backend, Placement, Submitted, silence, trainer_command
from attnres.tracking.run_store import RunRecord, RunStore
from attnres.tracking.states import RUNNING

_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def sbatch_script(log: Path) -> Path:
    """The SLURM script of a run, beside its log (the backend's own file: no other part of attnres writes one)."""
    return Path(log).with_suffix(".sbatch")


@dataclass(frozen=True)
class SlurmOptions:
    """What a SLURM job asks for beyond its ranks (``--nodes``, ``--gpus-per-node``, ``--partition``, ``--time``)."""

    nodes: int = 1  # nodes per run
    gpus_per_node: int = 0  # 0: a CPU job of --nproc ranks per node
    partition: str | None = None
    time_limit: str | None = None
    FLAGS: ClassVar[dict[str, str]] = {"time_limit": "--time"}


def check(p: Placement) -> None:
    """Refuse options that would not make a valid sbatch script."""
    o = p.options or SlurmOptions()
    if o.partition is not None and not _NAME.match(o.partition):
        raise AttnresError(f"bad --partition '{o.partition}'")
    if o.time_limit is not None and not _TIME.match(o.time_limit):
        raise AttnresError(f"bad --time '{o.time_limit}': use D-HH:MM:SS, HH:MM:SS or minutes")
    if o.nodes < 1 or o.gpus_per_node < 0 or p.nproc < 1:
        raise AttnresError("--nodes and --nproc must be >= 1, --gpus-per-node >= 0")


def script(run_id: int, db_url: str, p: Placement, workdir: Path, log: Path) -> str:
    """The sbatch script of one run. Every interpolated value is validated or shell-quoted."""
    o = p.options or SlurmOptions()
    per_node = o.gpus_per_node or p.nproc
    lines = ["#!/bin/bash", f"#SBATCH --job-name=attnres-{run_id}", f"#SBATCH --nodes={o.nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --output={shlex.quote(str(log))}", "#SBATCH --open-mode=append",
             f"#SBATCH --chdir={shlex.quote(str(workdir))}", "#SBATCH --requeue",
             f"#SBATCH --cpus-per-task={per_node}"]
    if o.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={o.gpus_per_node}")
    if o.partition:
        lines.append(f"#SBATCH --partition={o.partition}")
    if o.time_limit:
        lines.append(f"#SBATCH --time={o.time_limit}")
    rdzv = ["--nnodes=$SLURM_NNODES", "--rdzv_id=$SLURM_JOB_ID", "--rdzv_backend=c10d", "--rdzv_endpoint=$HEAD:$PORT"]
    # the rendezvous arguments are ours and name shell variables; everything else is quoted
    args = trainer_command(int(run_id), db_url, per_node, rdzv)
    cmd = " ".join(f'"{a}"' if a in rdzv else shlex.quote(a) for a in args)
    lines += ['HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "PORT=$((29500 + SLURM_JOB_ID % 1000))",
              f'echo "attnres run {int(run_id)} job $SLURM_JOB_ID restart ${{SLURM_RESTART_COUNT:-0}} on $HEAD"',
              # compute threads per process to fit the CPUs the job holds (the trainer records the number)
              f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-$(( ${{SLURM_CPUS_PER_TASK:-{per_node}}} / {per_node} ))}}",
              f"srun --kill-on-bad-exit=1 {cmd}"]
    return "\n".join(lines) + "\n"


def _run(args: list[str]) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise AttnresError(f"'{args[0]}' not found: is SLURM installed on this machine?") from None
    if out.returncode != 0:
        raise AttnresError(f"{args[0]} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return out.stdout.strip()


def job_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM states (PENDING, RUNNING, ...) of the jobs squeue still knows."""
    if not job_ids:
        return {}
    out = _run(["squeue", "-h", "-o", "%i %T"])  # all jobs: -j fails on ids squeue forgot
    states = dict(line.split()[:2] for line in out.splitlines() if line.strip())
    return {j: states[j] for j in job_ids if j in states}


class SlurmBackend(Backend):
    """One sbatch job per run."""

    name = "slurm"
    Options = SlurmOptions

    def check(self, placement: Placement) -> None:
        check(placement)

    def ranks(self, placement: Placement) -> int:
        """Every node's ranks (one per GPU, else ``--nproc``) on every node of the job."""
        o = placement.options or SlurmOptions()
        return o.nodes * (o.gpus_per_node or placement.nproc)

    def submit(self, store: RunStore, run_ids: Sequence[int], placement: Placement, *,
               detach: bool = False, on_tick: Callable[[], None] | None = None) -> Submitted:
        """Write and submit one sbatch script per run; record the job ids. SLURM jobs never block."""
        check(placement)
        done = Submitted()
        for rid in run_ids:
            run = store.run(rid)
            log = Path(run.log_path) if run.log_path else paths.run_log(rid)
            path = sbatch_script(log)
            path.write_text(script(rid, store.url, placement, Path.cwd(), log))
            job = _run(["sbatch", "--parsable", str(path)]).split(";")[0]
            store.update_run(rid, job_id=job)
            done.lines.append(f"run {rid}: submitted as SLURM job {job}")
        return done

    def describe(self, run_id: int | str, db_url: str, placement: Placement) -> list[str]:
        """The sbatch script the run's job would be (what ``--dry-run`` shows for SLURM)."""
        check(placement)
        rid = run_id if isinstance(run_id, int) else 0  # (a dry run has no run ids: job and log named run 0)
        log = paths.run_log(rid)
        return [f"sbatch {sbatch_script(log)}:", *("    " + line for line in
                                                         script(rid, db_url, placement, Path.cwd(), log).splitlines())]

    def poll(self, runs: Sequence[RunRecord]) -> dict[int, tuple[str, str]]:
        """A run is alive while squeue knows its job; gone when squeue has forgotten it."""
        jobs = [r for r in runs if r.job_id]
        try:
            known = job_states([r.job_id for r in jobs])
        except AttnresError:  # squeue unreachable: no verdict
            return {r.id: (UNKNOWN, "") for r in runs}
        out = {r.id: (UNKNOWN, "") for r in runs}
        for r in jobs:
            if r.job_id not in known:
                out[r.id] = (GONE, f"SLURM job {r.job_id} ended without recording an end")
            elif r.status == RUNNING and (why := silence(r)):  # listed, but its trainer went quiet (hung)
                out[r.id] = (GONE, f"{why} (SLURM job {r.job_id} is still listed as {known[r.job_id]})")
            else:
                out[r.id] = (ALIVE, known[r.job_id])
        return out

    def kill(self, run: RunRecord, store: RunStore | None = None) -> None:
        if run.job_id:
            _run(["scancel", str(run.job_id)])
