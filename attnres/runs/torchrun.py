"""``torchrun`` itself (``torch.distributed.run``'s ``main``), leaving without the interpreter's teardown.

    python -m attnres.runs.torchrun --standalone --nproc_per_node=2 -m attnres.train -- --run-id 3 --db runs.db

takes exactly torchrun's arguments and runs torchrun's own code: the elastic agent, its rendezvous,
its worker supervision and signal forwarding are unchanged. Only when every worker succeeded does
it leave with ``os._exit(0)`` after flushing its output: unloading torch took 0.55-0.8 s of each
run's end on a 2-core CPU (measured: a torchrun of a trivial worker, 3.15 s; through this module,
2.1-2.5 s), time in which the run is over and its queue still waits. A failure leaves the usual
way, with torchrun's error summary and exit code.
"""

from __future__ import annotations

import sys

from attnres.logline import exit_now


def main(argv: list[str] | None = None) -> None:
    """Run torchrun on ``argv`` (default: this process's arguments); leave at once if it succeeded."""
    from torch.distributed.run import main as torchrun

    torchrun(argv if argv is not None else sys.argv[1:])
    exit_now(0)


if __name__ == "__main__":
    main()
