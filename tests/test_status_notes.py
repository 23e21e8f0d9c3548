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
