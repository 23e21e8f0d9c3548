"""Bad input: one line on stderr and exit code 2, checked before anything runs, nothing recorded changed."""

from __future__ import annotations

import pytest
from helpers import attnres, in_process, runs, sha

from attnres.tracking import run_rows, states
from attnres.tracking.db import get_engine
from attnres.variants.registry import resolve_run

CASES = [
    (["launch", "standard", "--seeds", "abc"], "--seeds"),
    (["launch", "standard", "--seeds", "1.5"], "--seeds"),
    (["logs", "abc"], "run"),
    (["logs", "0"], "run"),
    (["launch", "standard", "--steps", "0"], "steps"),
    (["launch", "standard", "--steps", "-10"], "steps"),
    (["launch", "standard", "--set", "lr=nan"], "lr"),
    (["launch", "standard", "--set", "lr=inf"], "lr"),
    (["launch", "standard", "--set", "n_layer=-1"], "n_layer"),
    (["launch", "standard", "--set", "d_model=30"], "d_model"),
    (["launch", "standard", "--set", "dtype=fp8"], "dtype"),
    (["launch", "standard", "--set", "warmup=1e999"], "warmup"),
    (["launch", "standard", "--kill-if-worse-than", "standard", "--at-step", "5", "--by", "nan"], "--by"),
    (["launch", "standard", "--at-step", "0"], "--at-step"),
    (["launch", "standard", "--nodes", "0"], "--nodes"),
    (["launch", "standard", "--backend-opt", "novalue"], "--backend-opt"),
    (["status", "--interval", "0"], "--interval"),
    (["import", "huge-step.csv"], "step"),
    (["import", "huge-value.csv"], "value"),
    (["data", "prepare", "--source", "files", "--data-files", "x.txt", "--out", "x.txt"], "is a file"),
    (["data", "prepare", "--eval-fraction", "1.5"], "--eval-fraction"),
    (["bench", "data", "--megabytes", "nan"], "--megabytes"),
    (["resume", "1", "--db", "nothere.db"], "no database"),
    (["launch", "standard", "--experiment", "a b"], "--experiment"),
    (["report", "--experiment", "nope"], "no runs match"),
    (["report", "--budget", "0"], "--budget"),
    (["inspect", "1", "--out", "m.png"], "standard residuals"),
    (["import", "bad-depth-key.csv"], "depth-map key"),
    # a run id beyond what a database holds (SQLite's INTEGER: signed 64-bit), refused at parse time by every verb
    (["logs", "99999999999999999999"], "run"),
    (["kill", "99999999999999999999"], "run"),
    (["kill", "1", "9223372036854775808"], "9223372036854775807"),
    (["resume", "99999999999999999999"], "run"),
    (["inspect", "99999999999999999999"], "run"),
    (["sync", "--mirror", "mlflow", "--run", "99999999999999999999"], "--run"),
    # a seed: one rule for `launch --seeds` and an imported file's seed column
    (["import", "negative-seed.csv"], "bad seed '-3': a seed is a whole number from 0 to 2147483647"),
    (["import", "huge-seed.csv"], "bad seed '2147483648': a seed is a whole number from 0 to 2147483647"),
    (["import", "half-seed.csv"], "bad seed '1.5': a seed is a whole number from 0 to 2147483647"),
    (["launch", "standard", "--seeds", "-3"], "bad --seeds '-3': a seed is a whole number from 0 to 2147483647"),
    # a window longer than a split of the data, or a batch the train split cannot fill: before any run is recorded
    (["launch", "standard", "--set", "seq_len=1000000"], "seq_len 1000000 is longer than data 'builtin'"),
    (["launch", "standard", "--set", "seq_len=1000000", "--dry-run"], "seq_len 1000000 is longer than data"),
    (["launch", "standard", "control_block", "--set", "seq_len=64,1000000"], "seq_len 1000000"),
    (["launch", "standard", "--data", "builtin-bytes", "--set", "vocab_size=320", "--set", "seq_len=500000"],
     "data 'builtin-bytes'"),
    (["launch", "standard", "--set", "seq_len=19000", "--set", "batch_size=64"], "too short for one batch"),
    (["scale", "standard", "--sizes", "32x1", "--tokens", "100000", "--set", "seq_len=1000000", "--dry-run"],
     "seq_len 1000000"),
]


@pytest.fixture
def recorded(workdir):
    """A database with a finished run in it: bad input must leave it byte for byte as it is."""
    engine = get_engine(str(workdir / "runs.db"))
    run = run_rows.create_run(engine, resolve_run("standard", "tiny", 3), actor=states.IMPORTER, status=states.FINISHED)
    run_rows.log_metrics(engine, run, [(10, "eval_loss", 3.0)])
    engine.dispose()
    (workdir / "huge-step.csv").write_text("variant,seed,step,key,value\nstandard,1,99999999999999999999999,a,1\n")
    (workdir / "huge-value.csv").write_text("variant,seed,step,key,value\nstandard,1,5,a,1e400\n")
    (workdir / "x.txt").write_text("some text\n")
    (workdir / "bad-depth-key.csv").write_text("variant,seed,step,key,value\ncontrol_block,1,5,depth:x:y,0.5\n")
    for name, seed in (("negative", "-3"), ("huge", "2147483648"), ("half", "1.5")):
        (workdir / f"{name}-seed.csv").write_text(f"variant,seed,step,key,value\nstandard,{seed},0,eval_loss,1.0\n")
    return workdir / "runs.db"


@pytest.mark.parametrize("args,names", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(recorded, args, names, capsys, monkeypatch):
    before = sha(recorded)
    code, _, stderr = in_process(args, capsys, monkeypatch)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and names in lines[0], stderr
    assert "Traceback" not in stderr
    assert sha(recorded) == before and not (recorded.parent / "nothere.db").exists()


def test_a_window_longer_than_the_data_is_refused_before_a_run_is_recorded(workdir, capsys, monkeypatch):
    import json

    from attnres import paths
    from attnres.errors import AttnresError
    from attnres.runs import orchestrator, planning
    from attnres.tracking.run_store import RunStore

    manifest = json.loads((paths.dataset("builtin") / "manifest.json").read_text())
    shortest = min(max(s["tokens"] for s in split["shards"]) for split in manifest["splits"].values())
    for seq_len, dry in ((shortest, []), (10**6, ["--dry-run"])):
        code, out, err = in_process(["launch", "standard", "--set", f"seq_len={seq_len}", *dry], capsys, monkeypatch)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert f"seq_len {seq_len} is longer than data 'builtin'" in err and f"seq_len={shortest - 1} at most" in err
    assert not (workdir / "runs.db").exists()
    code, out, err = in_process(["launch", "standard", "--set", f"seq_len={shortest - 1}", "--set", "batch_size=1",
                                 "--dry-run"], capsys, monkeypatch)
    assert code == 0 and "— run" in out, err  # the longest window the data holds is taken
    # the library's launch (`next --launch` goes through it) refuses it too, before a run is queued
    store = RunStore(str(workdir / "other.db"))
    req = planning.request(["standard"], [1], overrides=["seq_len=1000000"])
    with pytest.raises(AttnresError, match="seq_len 1000000 is longer than data"):
        orchestrator.launch(store, req, planning.plan(store, req))
    assert runs(workdir, "other.db") == []


@pytest.mark.integration
@pytest.mark.parametrize("args,names", [CASES[0], CASES[6], CASES[19], CASES[24]], ids=lambda c: str(c))
def test_bad_input_through_the_installed_command_too(recorded, args, names):
    """A few of the cases as a user meets them: a new process, the real entry point."""
    before = sha(recorded)
    proc = attnres(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and names in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and sha(recorded) == before


@pytest.mark.integration
def test_status_in_an_empty_folder_is_an_empty_listing_not_an_error(workdir):
    proc = attnres("status", "--db", str(workdir / "none.db"))
    assert proc.returncode == 0 and "no runs yet" in proc.stdout and proc.stderr == ""
    assert not (workdir / "none.db").exists()
