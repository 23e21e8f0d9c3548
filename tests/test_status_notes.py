"""`attnres status` says why each shown run ended short of finished, under its table (its recorded message)."""

from __future__ import annotations

from helpers import in_process, runs
from seed_scenario import rows as seed_rows


def test_status_says_why_a_run_failed(workdir, capsys, monkeypatch):
    seed_rows().to_csv(workdir / "seed.csv", index=False)
    assert in_process(["import", workdir / "seed.csv"], capsys, monkeypatch)[0] == 0
    failed = [r for r in runs(workdir) if r["status"] == "failed"]
    assert failed and all(r["message"] for r in failed)
    code, out, err = in_process(["status", "--all"], capsys, monkeypatch)
    assert code == 0, err
    for r in failed:
        assert f"run {r['id']} failed: {r['message'].splitlines()[0]}" in out
    assert not [line for line in out.splitlines() if line.startswith("run ") and " finished:" in line]


def test_a_queued_run_gone_is_said_with_the_state_the_reconciler_records():
    """A queued run whose local queue is gone would be preempted; one whose cluster job squeue forgot, failed:
    status says each with the state `attnres sync` records, never one for the other."""
    from attnres.runs.status_view import JOB_GONE_MARK, ORPHAN_MARK, mark, pending_notes

    pending = {4: ("preempted", "not started: its queue (pid 7) is gone"),
               5: ("failed", "SLURM job 9 ended without recording an end")}
    rows = [{"run": 4, "status": "queued"}, {"run": 5, "status": "queued"}]
    assert mark("queued", 4, pending, {}) == ORPHAN_MARK and mark("queued", 5, pending, {}) == JOB_GONE_MARK
    notes = pending_notes(rows, pending, {})
    assert "run 5 is recorded queued, but SLURM job 9 ended without recording an end: `attnres sync` records it " \
           "failed" in notes
    assert any(n.startswith("run 4 is queued, but its queue is gone: `attnres sync` records it preempted")
               for n in notes)
    assert not any("run 5" in n and "preempted" in n for n in notes)
