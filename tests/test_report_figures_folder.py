"""Where a report's figures go: a folder named after the document beside it, or the folder `--figures` names;
never the `reports` package. The document links them by their path relative to itself."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import in_process
from seed_scenario import rows as seed_rows

from attnres import reports


def links(document: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", document.read_text())


def test_figures_beside_the_document_or_in_the_folder_asked_for(workdir, capsys, monkeypatch):
    seed_rows().to_csv(workdir / "seed.csv", index=False)
    assert in_process(["import", workdir / "seed.csv"], capsys, monkeypatch)[0] == 0
    package = Path(reports.__file__).parent
    before = sorted(package.rglob("*.png"))
    code, _, err = in_process(["report", "--out", "docs/r.md"], capsys, monkeypatch)
    assert code == 0, err
    assert links(workdir / "docs/r.md") == ["r_figures/delta_curves.png", "r_figures/throughput_vs_delta.png"]
    code, _, err = in_process(["report", "--out", "docs/s.md", "--figures", "figs/s"], capsys, monkeypatch)
    assert code == 0, err
    got = links(workdir / "docs/s.md")
    assert got == ["../figs/s/delta_curves.png", "../figs/s/throughput_vs_delta.png"]
    assert all((workdir / "docs" / link).resolve().stat().st_size for link in got)  # the links resolve
    assert sorted(package.rglob("*.png")) == before
