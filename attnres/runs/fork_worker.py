"""A trainer forked from its torchrun agent: ``torchrun --start-method fork --run-path`` runs this file in each
worker process (:mod:`attnres.runs.torchrun` turns ``--start-method fork -m attnres.train`` into that, on a CPU
build of torch), and it calls :func:`attnres.train.main` with the worker's arguments.

Forked, a worker starts with the agent's imports (torch is most of a trainer's start: ~3.5 s of each run on a
2-core CPU) instead of a new interpreter's. What a worker that torchrun starts as a new interpreter has is
restored first: a session of its own (a terminal's Ctrl-C reaches the agent, which stops its workers), the
signals' dispositions (the agent's handlers raise its own exception), torch's compute threads
(``OMP_NUM_THREADS``, which torch read when it loaded in the agent) and unbuffered output (``python -u``).

How it leaves is what torchrun's agent needs to see of it: a worker that returns waits until the agent has read
every rank's result, which an agent stopping its workers never does; so a stopped worker leaves at once with
its code instead (:data:`TERMINATED`, 130 for SIGINT), and a SIGTERM after the trainer returned ends it too."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from attnres.logline import exit_now

#: the exit code of a trainer stopped by SIGTERM (128 + 15, as a shell reports it)
TERMINATED = 128 + signal.SIGTERM
INTERRUPTED = 128 + signal.SIGINT


def restore_signals() -> None:
    """The dispositions a new interpreter starts with, for every signal torchrun's agent handles (its
    ``--signals-to-handle``, which it passes on in ``TORCHELASTIC_SIGNALS_TO_HANDLE``)."""
    names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    for name in {n.strip() for n in names.split(",")} | {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"}:
        number = getattr(signal, name, None)
        if isinstance(number, signal.Signals):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)


def run(argv: list[str]) -> None:
    """Train as ``python -u -m attnres.train ARGV`` would (see the module's docstring for how it leaves)."""
    with contextlib.suppress(OSError):
        os.setsid()  # (as torchrun starts a worker: its own session and process group)
    restore_signals()
    from attnres.training.loop import Preemption, started_as

    preemption = Preemption()  # SIGTERM: the trainer's flag from the first moment
    started_as("forked")
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

    # a stopped worker leaves at once (output flushed, no result for the agent to wait on)
    try:
        code = main(argv, preemption)
    except KeyboardInterrupt:  # (recorded by the trainer; torch's worker wrapper would take it for a success)
        exit_now(INTERRUPTED)
    signal.signal(signal.SIGTERM, lambda *_: exit_now(TERMINATED))  # (the agent stopping its workers from now on)
    if preemption.requested:
        exit_now(TERMINATED)
    if code:
        sys.exit(code)


if __name__ == "__main__":  # (run by torchrun's run_script_path: sys.argv is [this file, *the trainer's arguments])
    run(sys.argv[1:])
