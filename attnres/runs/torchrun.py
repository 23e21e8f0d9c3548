"""``torchrun`` itself (``torch.distributed.run``'s ``main``), its trainer workers forked on a CPU build of torch,
leaving without the interpreter's teardown.

    python -m attnres.runs.torchrun --standalone --nproc_per_node=2 -m attnres.train -- --run-id 3 --db runs.db

takes exactly torchrun's arguments and runs torchrun's own code: the elastic agent, its rendezvous,
its worker supervision and signal forwarding are unchanged. Two things are added:

* On a CPU build of torch, ``-m attnres.train`` becomes torchrun's own ``--run-path`` of the trainer's file with
  ``--start-method fork``, the trainer imported first: each worker is then a fork of the agent with torch and the
  trainer already in memory, where a worker of its own interpreter imported them again (3.3-3.6 s of each run
  attempt on a 2-core CPU: ``attnres bench`` ``run start``). A CUDA build keeps torchrun's default, workers
  started as their own processes: a process that may have touched the CUDA runtime must not be forked.
* Only when every worker succeeded does it leave with ``os._exit(0)`` after flushing its output:
  unloading torch took 0.55-0.8 s of each run's end on a 2-core CPU (measured: a torchrun of a trivial worker,
  3.15 s; through this module, 2.1-2.5 s), time in which the run is over and its queue still waits. A failure
  leaves the usual way, with torchrun's error summary and exit code.
"""

from __future__ import annotations

import sys

from attnres.logline import exit_now

TRAINER = "attnres.train"


def forks_workers() -> bool:
    """Whether this torch starts the trainer's workers by fork: a build without CUDA (see the module's docstring)."""
    import torch

    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


def as_forked(args: object) -> object:
    """torchrun's parsed ``args`` for ``-m attnres.train`` made its ``--run-path`` of the trainer's file, forked
    from this process with the trainer imported (other scripts, and CUDA builds, unchanged)."""
    if not (getattr(args, "module", False) and args.training_script == TRAINER and not args.no_python
            and forks_workers()):
        return args
    import gc

    import attnres.train as trainer  # in memory before the fork: the workers do not import it again

    gc.freeze()  # what is imported stays out of the collector's walks: a worker's pages stay shared with the agent

    args.module, args.run_path, args.start_method = False, True, "fork"
    args.training_script = trainer.__file__
    # -u, as torchrun gives a worker of its own: the forked workers share this process's streams, written through
    sys.stdout.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    return args


def main(argv: list[str] | None = None) -> None:
    """Run torchrun on ``argv`` (default: this process's arguments); leave at once if it succeeded."""
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.run import parse_args, run

    record(lambda: run(as_forked(parse_args(argv if argv is not None else sys.argv[1:]))))()
    exit_now(0)


if __name__ == "__main__":
    main()
