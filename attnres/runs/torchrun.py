"""``torchrun`` itself (``torch.distributed.run``'s ``main``), leaving without the interpreter's teardown.

    python -m attnres.runs.torchrun --standalone --nproc_per_node=2 -m attnres.train -- --run-id 3 --db runs.db

takes exactly torchrun's arguments and runs torchrun's own code: the elastic agent, its rendezvous,
its worker supervision and signal forwarding are unchanged. Only when every worker succeeded does
it leave with ``os._exit(0)`` after flushing its output: unloading torch took 0.55-0.8 s of each
run's end on a 2-core CPU (measured: a torchrun of a trivial worker, 3.15 s; through this module,
2.1-2.5 s), time in which the run is over and its queue still waits. A failure leaves the usual
way, with torchrun's error summary and exit code.

With ``--start-method fork`` and a CPU build of torch, ``-m attnres.train`` workers are forked from the agent
(:func:`forked`), which has imported torch already, instead of started as new interpreters: torchrun's own
``--run-path`` of :mod:`attnres.runs.fork_worker`. Each run's start took ~3.5 s less on a 2-core CPU (a torch
import). A CUDA build starts them as new interpreters (its agent has asked CUDA for the devices).
"""

from __future__ import annotations

import sys
import traceback
import warnings

from attnres.logline import exit_now
from attnres.runs import fork_worker


def main(argv: list[str] | None = None) -> None:
    """Run torchrun on ``argv`` (default: this process's arguments); leave at once if it succeeded."""
    from torch.distributed.run import main as torchrun

    try:
        torchrun(forked(argv if argv is not None else sys.argv[1:]))
    except Exception:  # noqa: BLE001 (any failure)
        # torchrun's error summary, as the interpreter would print it; then no teardown, which would join a
        # forked worker the agent gave up on (a non-daemon process: it may never end)
        traceback.print_exc()
        exit_now(1)
    exit_now(0)


#: the module whose workers a ``--start-method fork`` command forks (:mod:`attnres.runs.fork_worker` runs it)
FORKED = "attnres.train"


def forked(argv: list[str]) -> list[str]:
    """``argv``, where it asks for ``--start-method fork`` with ``-m attnres.train`` workers, as torchrun's own
    ``--run-path`` of :mod:`attnres.runs.fork_worker`: torchrun forks a function's workers from its agent, where
    it starts a module's as new interpreters whatever the start method. Every other command is torchrun's as
    given."""
    from torch.distributed.run import parse_args

    args = parse_args(argv)
    if args.start_method != "fork" or not args.module or args.run_path or args.training_script != FORKED:
        return argv
    if cuda_build():  # (the agent's launch config asks CUDA for its devices, and a forked child cannot use it then)
        return argv
    script = next((i for i in range(1, len(argv)) if argv[i] == FORKED and argv[i - 1] in ("-m", "--module")),
                  None)  # (the module's name: torchrun's first positional)
    if script is None:
        return argv
    warnings.filterwarnings("ignore", message=r".*fork\(\).*", category=DeprecationWarning)  # (3.12+: the agent's
    # threads are its rendezvous store's; a worker never uses them)
    return [*argv[: script - 1], "--run-path", fork_worker.__file__, "--", *args.training_script_args]


def cuda_build() -> bool:
    """Whether this torch is built with CUDA (asked without initialising CUDA): its workers are started as new
    interpreters, as torchrun starts them, as the agent's launch config has asked CUDA for its device count,
    which a forked child cannot use."""
    import torch

    return bool(torch.cuda._is_compiled())


if __name__ == "__main__":
    main()
