"""SLURM backend: one sbatch job per run, ``srun torchrun`` with a c10d rendezvous across nodes.

The job is requeueable; a requeued (preempted) job starts the trainer again, which continues
from the run's last checkpoint. The database records the job id; status and kill go through
``squeue`` and ``scancel``. For jobs that span machines, point ``--db`` at PostgreSQL.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from attnres.errors import AttnresError
from attnres.launch import logs_dir
from attnres.tracking import store

_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0  # 0 = CPU job: nproc processes per node
    nproc: int = 1
    time: str | None = None
    cpus_per_task: int | None = None

    def validate(self) -> None:
        if self.partition is not None and not _NAME.match(self.partition):
            raise AttnresError(f"bad --partition '{self.partition}'")
        if self.time is not None and not _TIME.match(self.time):
            raise AttnresError(f"bad --time '{self.time}': use D-HH:MM:SS, HH:MM:SS or minutes")
        if self.nodes < 1 or self.gpus_per_node < 0 or self.nproc < 1:
            raise AttnresError("--nodes and --nproc must be >= 1, --gpus-per-node >= 0")


def script(run_id: int, db_url: str, opts: SlurmOptions, workdir: Path, log: Path) -> str:
    """The sbatch script of one run. Every interpolated value is validated or shell-quoted."""
    per_node = opts.gpus_per_node or opts.nproc
    lines = ["#!/bin/bash", f"#SBATCH --job-name=attnres-{run_id}", f"#SBATCH --nodes={opts.nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --output={shlex.quote(str(log))}", "#SBATCH --open-mode=append",
             f"#SBATCH --chdir={shlex.quote(str(workdir))}", "#SBATCH --requeue"]
    lines += [f"#SBATCH --cpus-per-task={opts.cpus_per_task or per_node}"]
    if opts.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={opts.gpus_per_node}")
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.time:
        lines.append(f"#SBATCH --time={opts.time}")
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={per_node}"]
    cmd = " ".join(shlex.quote(a) for a in torchrun)
    cmd += ' --nnodes="$SLURM_NNODES" --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$HEAD:$PORT"'
    cmd += " -m attnres.train -- --run-id " + str(int(run_id)) + " --db " + shlex.quote(db_url)
    lines += ['HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "PORT=$((29500 + SLURM_JOB_ID % 1000))",
              f'echo "attnres run {int(run_id)} job $SLURM_JOB_ID restart ${{SLURM_RESTART_COUNT:-0}} on $HEAD"',
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


def submit(engine: Engine, db_url: str, run_ids: list[int], opts: SlurmOptions) -> dict[int, str]:
    """Write and submit one sbatch script per run; record the job ids. Returns {run_id: job_id}."""
    opts.validate()
    jobs = {}
    for rid in run_ids:
        run = store.get_run(engine, rid)
        log = Path(run.log_path or logs_dir() / f"run-{rid}.log").resolve()
        path = log.with_suffix(".sbatch")
        path.write_text(script(rid, db_url, opts, Path.cwd(), log))
        args = ["sbatch", "--parsable"]
        job = _run([*args, str(path)]).split(";")[0]
        store.update_run(engine, rid, job_id=job, backend="slurm")
        jobs[rid] = job
    return jobs


def job_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM states (PENDING, RUNNING, ...) of the jobs squeue still knows."""
    if not job_ids:
        return {}
    out = _run(["squeue", "-h", "-o", "%i %T"])  # all jobs: -j fails on ids squeue forgot
    states = dict(line.split()[:2] for line in out.splitlines() if line.strip())
    return {j: states[j] for j in job_ids if j in states}


def cancel(job_id: str) -> None:
    _run(["scancel", str(job_id)])


def reconcile(engine: Engine) -> list[int]:
    """Runs whose SLURM job is gone while the database still says queued/running: mark failed."""
    runs = [r for r in store.active_runs(engine) if r.backend == "slurm" and r.job_id]
    if not runs:
        return []
    try:
        states = job_states([r.job_id for r in runs])
    except AttnresError:
        return []
    dead = []
    for r in runs:
        if r.job_id not in states:
            fresh = store.get_run(engine, r.id)
            if fresh.status in ("queued", "running"):
                store.update_run(engine, r.id, status="failed", ended_at=store.now(),
                                 message=f"SLURM job {r.job_id} ended without recording an end")
                dead.append(r.id)
    return dead
