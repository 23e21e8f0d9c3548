"""The training loop in process (no database, no torchrun): how a run ends, and exact resumption."""

from __future__ import annotations

import pytest

from attnres.model.flops import training_flops
from attnres.tracking import states
from attnres.training.distributed import single
from attnres.training.loop import MemoryRecorder, Preemption, train
from attnres.variants.describe import model_params
from attnres.variants.registry import resolve_run

SMALL = ["batch_size=2", "eval_batches=1", "warmup=2", "log_every=1"]


def cfg(steps: int, *extra: str, variant: str = "standard"):
    return resolve_run(variant, "tiny", 5, [*SMALL, f"steps={steps}", *extra])


def test_a_run_finishes_with_its_evals_and_logs(workdir):
    rec = MemoryRecorder()
    config = cfg(6, "eval_every=3")
    ending = train(config, single(), rec, workdir / "ck")
    assert (ending.status, ending.step) == (states.FINISHED, 6)
    assert sorted(rec.metrics["eval_loss"]) == [0, 3, 6] and sorted(rec.metrics["train_loss"]) == list(range(1, 7))
    assert rec.metrics["eval_loss"][6] < rec.metrics["eval_loss"][0]
    assert {"lr", "grad_norm", "tokens_per_s", "peak_memory_bytes"} <= set(rec.metrics)
    assert rec.steps == list(range(1, 7)) and (workdir / "ck" / "last.pt").exists()
    # the compute so far, each logged step: what a scaling law is fitted against, at least 6·N·tokens
    flops, tokens = rec.metrics["train_flops"], 2 * config.model.seq_len
    non_embedding = model_params(config.model)["non_embedding"]
    assert flops == {step: step * flops[1] for step in range(1, 7)}
    assert flops[6] == pytest.approx(training_flops(config, non_embedding)) and flops[1] > 6 * non_embedding * tokens


def test_a_non_finite_loss_ends_as_diverged_at_its_step(workdir):
    ending = train(cfg(30, "lr=1e4", "grad_clip=0"), single(), MemoryRecorder(), workdir / "ck")
    assert ending.status == states.DIVERGED and 1 <= ending.step < 30 and "non-finite" in ending.message


def test_the_recorders_verdict_stops_the_run_at_that_eval(workdir):
    rec = MemoryRecorder(stop_at={4: "worse than the baseline"})
    ending = train(cfg(10, "eval_every=2"), single(), rec, workdir / "ck")
    assert (ending.status, ending.step, ending.message) == (states.STOPPED, 4, "worse than the baseline")
    assert max(rec.metrics["train_loss"]) == 4


def test_sigterm_preempts_after_the_step_with_a_checkpoint(workdir):
    flag = Preemption()
    flag.requested = True
    ending = train(cfg(10), single(), MemoryRecorder(), workdir / "ck", preemption=flag)
    assert (ending.status, ending.step) == (states.PREEMPTED, 1) and (workdir / "ck" / "last.pt").exists()


@pytest.mark.parametrize("variant", ["standard", "control_block"])
def test_resuming_from_a_checkpoint_reproduces_the_uninterrupted_run_exactly(workdir, variant):
    full = MemoryRecorder()
    train(cfg(8, "eval_every=2", variant=variant), single(), full, workdir / "a")
    first = cfg(8, "eval_every=2", "checkpoint_every=3", variant=variant)
    flag = Preemption()

    class StopAt3(MemoryRecorder):  # a preemption that arrives during step 3
        def progress(self, step: int) -> None:
            super().progress(step)
            flag.requested = step == 2

    part = StopAt3()
    ending = train(first, single(), part, workdir / "b", preemption=flag)
    assert (ending.status, ending.step) == (states.PREEMPTED, 3)
    ending = train(first, single(), part, workdir / "b", preemption=Preemption())
    assert ending.status == states.FINISHED
    for key in ("train_loss", "eval_loss"):
        assert part.metrics[key] == full.metrics[key]  # bit-identical at every step


def test_a_cut_last_checkpoint_falls_back_to_the_previous_one_with_one_line(workdir, capsys):
    full = MemoryRecorder()
    train(cfg(8, "eval_every=2", "checkpoint_every=2"), single(), full, workdir / "ck")
    last = workdir / "ck" / "last.pt"
    last.write_bytes(last.read_bytes()[:2000])  # a copy cut short
    again = MemoryRecorder()
    ending = train(cfg(8, "eval_every=2", "checkpoint_every=2"), single(), again, workdir / "ck")
    err = capsys.readouterr().err
    assert "checkpoint last.pt" in err and "continuing from prev.pt (step 6)" in err
    assert ending.status == states.FINISHED and sorted(again.metrics["train_loss"]) == [7, 8]
    assert again.metrics["train_loss"] == {s: full.metrics["train_loss"][s] for s in (7, 8)}


def test_no_readable_checkpoint_is_one_clear_error(workdir):
    from attnres.errors import AttnresError

    (workdir / "ck").mkdir()
    (workdir / "ck" / "last.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(AttnresError, match=r"no readable checkpoint.*--restart"):
        train(cfg(4), single(), MemoryRecorder(), workdir / "ck")


class Killed(BaseException):
    """A SIGKILL between two file operations of a save."""


def test_a_save_killed_between_any_two_renames_leaves_a_checkpoint_that_damage_to_last_cannot_reach(
        tmp_path, monkeypatch):
    import itertools
    import os

    import torch

    from attnres.training import checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for k in range(4):  # a kill before each link or rename of the third save, and none
        folder = tmp_path / f"kill-{k}"
        checkpoint.save(folder, model, opt, 1)
        checkpoint.save(folder, model, opt, 2)
        calls = itertools.count()

        def dying(real, calls=calls, k=k):
            def op(*args, **kwargs):
                if next(calls) == k:
                    raise Killed
                return real(*args, **kwargs)
            return op

        with monkeypatch.context() as m:
            m.setattr(os, "link", dying(os.link))
            m.setattr(os, "replace", dying(os.replace))
            try:
                checkpoint.save(folder, model, opt, 3)
            except Killed:
                pass
        last = folder / "last.pt"
        last.write_bytes(last.read_bytes()[:100])  # last.pt damaged in place afterwards (cut, overwritten)
        assert checkpoint.load(folder, model, opt) in (1, 2), k  # never both gone
