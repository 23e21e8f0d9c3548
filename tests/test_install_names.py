"""attnres installs under its own name only: cli/ and reports/ are attnres.cli and attnres.reports, so another
distribution's top-level `cli` or `reports` package lives beside it in one environment, neither shadowing the other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"attnres": "attnres", "cli": "attnres.cli", "reports": "attnres.reports"}


def test_every_package_is_installed_under_attnres():
    """pyproject.toml lists every package folder (a new sub-package left out would be missing from a wheel), by its
    attnres name, and maps cli/ and reports/ to attnres.cli and attnres.reports."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    assert set(tool["packages"]) == found
    assert tool["package-dir"] == {"attnres.cli": "cli", "attnres.reports": "reports"}
    assert all(p.split(".")[0] == "attnres" for p in tool["packages"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"attnres": "attnres.cli.main:main"}


def _pip(python: Path, *args: str | Path) -> None:
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    *map(str, args)], check=True, capture_output=True, text=True, timeout=600)


@pytest.mark.integration  # (a venv, two installs, the installed command)
def test_a_venv_holding_other_cli_and_reports_packages_keeps_both(tmp_path):
    """A fresh venv (this one's dependencies on its path) gets a distribution with top-level `cli` and `reports`
    packages, and attnres built as a wheel (not editable): each import finds its own, and the installed `attnres`
    command runs a verb that reads a database and one that imports the report code."""
    other = tmp_path / "other"
    for package in ("cli", "reports"):
        (other / package).mkdir(parents=True)
        (other / package / "__init__.py").write_text(f"WHO = 'other-{package}'\n")
    (other / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "other-reports"
        version = "1.0"
        [tool.setuptools]
        packages = ["cli", "reports"]
        """))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages (torch, pandas, pip, setuptools...) after the venv's own: a path, so the
    # editable attnres of this checkout (a .pth file there) is not seen
    Path(site, "deps.pth").write_text(ours + "\n")
    _pip(python, other)
    build = tmp_path / "build"  # (a copy: a build writes its own folders beside the sources)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, build / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, build / name)
    _pip(python, build)

    probe = textwrap.dedent("""\
        import cli, reports
        import attnres, attnres.cli.main, attnres.reports.build
        print(cli.WHO, reports.WHO)
        print(attnres.cli.main.__file__)
        print(attnres.reports.build.__file__)
        print(attnres.__file__)
        """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    got = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env=env).stdout.splitlines()
    assert got[0] == "other-cli other-reports", got
    assert all(str(venv) in line and "site-packages/attnres/" in line for line in got[1:]), got
    assert got[1].endswith("attnres/cli/main.py") and got[2].endswith("attnres/reports/build.py")

    command = venv / "bin" / "attnres"
    env |= {"ATTNRES_DB": str(tmp_path / "runs.db")}
    shown = subprocess.run([command, "status"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert shown.returncode == 0 and "no runs yet" in shown.stdout, shown.stderr
    report = subprocess.run([command, "report", "--out", "r.md"], capture_output=True, text=True, cwd=tmp_path,
                            env=env, timeout=300)
    assert "Traceback" not in report.stderr and report.returncode in (0, 2), report.stderr
