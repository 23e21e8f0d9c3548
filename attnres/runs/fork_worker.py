"""A trainer forked from its torchrun agent: ``torchrun --start-method fork --run-path`` runs this file in each
worker process (:mod:`attnres.runs.torchrun` turns ``--start-method fork -m attnres.train`` into that), and it
calls :func:`attnres.train.main` with the worker's arguments.

Forked, a worker starts with the agent's imports (torch is most of a trainer's start: ~3.5 s of each run on a
2-core CPU) instead of a new interpreter's. What a new interpreter would start with is restored first: the
signals' dispositions (the agent's handlers raise its own exception), torch's compute threads
(``OMP_NUM_THREADS``, which torch read when it loaded in the agent) and unbuffered output (``python -u``, as
torchrun starts a worker)."""

from __future__ import annotations

import os
import signal
import sys

#: the exit code of a trainer stopped by SIGTERM (128 + 15, as a shell reports it)
TERMINATED = 128 + signal.SIGTERM


def run(argv: list[str]) -> None:
    """Train as ``python -u -m attnres.train ARGV`` would. A run stopped by SIGTERM (saved, recorded preempted)
    leaves at once with :data:`TERMINATED`: the agent that passed the signal on is stopping its workers and
    reads no worker's result, which a worker returning normally would wait for until the agent kills it."""
    from attnres.training.loop import Preemption

    preemption = Preemption()  # SIGTERM: the trainer's flag from the first moment (the agent's handler before)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for other in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(other, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=True)
        except (AttributeError, ValueError):  # (a stream replaced by one that cannot)
            pass
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    from attnres.train import main

    code = main(argv, preemption)
    if preemption.requested:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(TERMINATED)
    if code:
        sys.exit(code)


if __name__ == "__main__":  # (run by torchrun's run_script_path: sys.argv is [this file, *the trainer's arguments])
    run(sys.argv[1:])
