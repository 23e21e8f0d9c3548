"""The structure the code promises, checked on its source: layers, one owner of run states, SQL in tracking/.

These read the code as text (Python's ast), so they hold for every module, including ones no
other test imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "attnres"
# each top-level folder and the name it installs as (pyproject.toml's package-dir: cli/ is attnres.cli)
INSTALLED = {"attnres": "attnres", "cli": "attnres.cli", "reports": "attnres.reports"}


def dotted(path: Path) -> str:
    """A source file's (or package folder's) installed dotted name: cli/main.py is attnres.cli.main."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    return ".".join([INSTALLED[parts[0]], *parts[1:]])


def modules(package: Path) -> dict[str, ast.Module]:
    """Every module of a package by its installed dotted name, parsed."""
    return {dotted(path): ast.parse(path.read_text(), filename=str(path)) for path in sorted(package.rglob("*.py"))}


PACKAGES = {name for folder in INSTALLED for name in (dotted(p) for p in (ROOT / folder).rglob("__init__.py"))}


def imports_of(name: str, tree: ast.Module, with_base: bool = True) -> set[str]:
    """What a module imports anywhere (top level or inside functions), as dotted names.

    ``from a.b import c`` gives ``a.b.c`` and, ``with_base``, ``a.b``.
    """
    found: set[str] = set()
    package = name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                parts = package.split(".")
                keep = parts[: len(parts) - node.level + (1 if _is_package(name) else 0)]
                base = ".".join([*keep, base] if base else keep)
            if with_base:
                found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def _is_package(name: str) -> bool:
    return name in PACKAGES


def graph(package: Path) -> dict[str, set[str]]:
    mods = modules(package)
    return {name: {i for i in imports_of(name, tree) if i in mods and i != name} for name, tree in mods.items()}


def test_the_library_import_graph_has_no_cycle():
    g = graph(LIBRARY)
    # a package imports its own __init__ implicitly; edges into a parent package are not cycles of design
    g = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in g.items()}
    seen, stack, cycles = set(), [], []

    def visit(node: str) -> None:
        if node in stack:
            cycles.append([*stack[stack.index(node):], node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for dep in sorted(g[node]):
            visit(dep)
        stack.pop()

    for node in sorted(g):
        visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_library_never_imports_the_report_package_or_the_cli():
    library = modules(LIBRARY)
    assert "attnres.runs.status_view" in library and not any(n.startswith(("attnres.cli", "attnres.reports"))
                                                        for n in library)
    bad = {name: sorted(i for i in imports_of(name, tree)
                        if i.startswith(("attnres.reports", "attnres.cli")) or i.split(".")[0] in {"reports", "cli"})
           for name, tree in library.items()}
    assert not {k: v for k, v in bad.items() if v}


def test_nothing_imports_the_folders_by_their_top_level_names():
    """The CLI and the report code are imported as attnres.cli and attnres.reports only (a top-level `cli` or
    `reports` is another distribution's name); in the tests too."""
    found = {str(p.relative_to(ROOT)): sorted(i for i in imports_of("tests", ast.parse(p.read_text()))
                                              if i.split(".")[0] in {"cli", "reports"})
             for p in [*ROOT.glob("*/**/*.py")] if p.parts[len(ROOT.parts)] in {*INSTALLED, "tests"}}
    assert not {k: v for k, v in found.items() if v}


def test_only_reports_build_and_bench_touch_the_database_or_the_disk_in_reports():
    pure = {name: tree for name, tree in modules(ROOT / "reports").items()
            if name.removeprefix("attnres.") not in {"reports.build", "reports.build_scaling", "reports.build_study",
                                                     "reports.bench", "reports.bench_power", "reports.bench_scaling"}}
    for name, tree in pure.items():
        imported = imports_of(name, tree)
        assert not any(i.startswith(("sqlalchemy", "attnres.tracking.report_reads", "attnres.tracking.db",
                                     "attnres.tracking.run_rows", "attnres.tracking.run_store"))
                       for i in imported), name


OUTSIDE_TRACKING = (LIBRARY, ROOT / "reports", ROOT / "cli")


def outside_tracking() -> dict[str, ast.Module]:
    """Every module of the library, the report package and the CLI, except attnres/tracking/."""
    return {name: tree for package in OUTSIDE_TRACKING for name, tree in modules(package).items()
            if not name.startswith("attnres.tracking")}


def test_database_access_lives_in_tracking():
    """SQLAlchemy (and sqlite3, the drivers, Alembic) are imported by attnres/tracking/ only: not even the Engine
    type or an error class (a store raises :data:`attnres.tracking.DatabaseError`)."""
    offenders = {}
    for name, tree in outside_tracking().items():
        hits = sorted(i for i in imports_of(name, tree, with_base=False)
                      if i.split(".")[0] in {"sqlalchemy", "sqlite3", "psycopg", "alembic"}
                      or i.startswith(("attnres.tracking.schema", "attnres.tracking.db.get_engine")))
        if hits:
            offenders[name] = hits
    assert not offenders, offenders


def _engine_functions() -> set[tuple[str, str]]:
    """(module, name) of every function or class of attnres/tracking/ that takes an engine or a connection."""
    found = set()
    for name, tree in modules(LIBRARY / "tracking").items():
        for node in tree.body:
            fn = node
            if isinstance(node, ast.ClassDef):
                fn = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                args = [a.arg for a in fn.args.args if a.arg != "self"]
                if args and args[0] in {"engine", "conn"}:
                    found.add((name, node.name))
    return found


def test_nothing_outside_tracking_takes_an_engine_or_calls_what_does():
    """Outside attnres/tracking/ the database is a :class:`attnres.tracking.run_store.RunStore`: no function takes
    an engine, and no function of tracking/ that takes one is imported or called (the store's methods are)."""
    engine_fns = _engine_functions()
    assert ("attnres.tracking.run_rows", "get_run") in engine_fns  # (the check sees them)
    offenders: dict[str, list[str]] = {}
    for name, tree in outside_tracking().items():
        aliases = {}  # local name -> tracking module, for `from attnres.tracking import run_rows`
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and ast.unparse(node.test) == "TYPE_CHECKING" for n in ast.walk(node)}  # (annotations)
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "attnres.tracking":
                aliases |= {a.asname or a.name: f"attnres.tracking.{a.name}" for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnres.tracking."):
                offenders.setdefault(name, []).extend(f"imports {node.module}.{a.name}" for a in node.names
                                                      if (node.module, a.name) in engine_fns)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                    annotation = ast.unparse(a.annotation) if a.annotation else ""
                    if a.arg == "engine" or "Engine" in annotation:
                        offenders.setdefault(name, []).append(f"{node.name}() takes {a.arg}: {annotation}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and (aliases.get(node.value.id), node.attr) in engine_fns):
                offenders.setdefault(name, []).append(f"uses {aliases[node.value.id]}.{node.attr}")
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def status_writes(tree: ast.Module) -> list[int]:
    """Lines that write a run's status: ``status=`` in a call, ``.status = ...``, or an insert/update
    of the runs table naming ``status``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in {"values", "update_run", "Run"} and any(k.arg == "status" for k in node.keywords):
                lines.append(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
                lines.append(node.lineno)
    return lines


def test_run_status_is_written_by_the_state_machine_only():
    writes = {name: status_writes(tree) for name, tree in modules(LIBRARY).items()}
    writes = {k: v for k, v in writes.items() if v}
    assert set(writes) == {"attnres.tracking.states"}, writes


@pytest.mark.parametrize("word", ['"queued"', '"running"', '"finished"', '"failed"', '"killed"', '"diverged"',
                                  '"stopped"', '"preempted"'])
def test_state_words_are_spelled_in_the_state_module_only(word):
    """Code compares states through attnres.tracking.states' names, never through string literals."""
    spelled = []
    for path in LIBRARY.rglob("*.py"):
        if path.name == "states.py" or "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare | ast.Dict | ast.Tuple | ast.Set | ast.List):
                for c in ast.walk(node):
                    if isinstance(c, ast.Constant) and repr(c.value).replace("'", '"') == word:
                        spelled.append(f"{path.relative_to(ROOT)}:{c.lineno}")
    assert not spelled, spelled


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in [*LIBRARY.rglob("*.py"), *(ROOT / "reports").rglob("*.py"),
                                                  *(ROOT / "cli").rglob("*.py")]
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_a_test_that_starts_processes_is_marked_integration():
    """`pytest -m "not integration"` runs in process: a test that calls the real CLI (``attnres(...)``) or
    ``subprocess``, itself or through a function, class or fixture of its module, is marked ``integration``.
    (Read from the source, so it holds for tests skipped here too, PostgreSQL's and SLURM's; conftest.py fails
    any other test that starts a process when it runs.)"""
    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        uses = {name: {m.id for m in ast.walk(node) if isinstance(m, ast.Name)} for name, node in defs.items()}
        for name, node in defs.items():
            if isinstance(node, ast.FunctionDef):
                uses[name] |= {a.arg for a in node.args.args}  # its fixtures
        spawns = {name for name, node in defs.items() if any(
            (isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id == "attnres")
            or (isinstance(m, ast.Name) and m.id == "subprocess") for m in ast.walk(node))}
        while grown := {name for name in defs if name not in spawns and uses[name] & spawns}:
            spawns |= grown
        whole = any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in n.targets)
                    and "pytest.mark.integration" in ast.unparse(n.value) for n in tree.body)
        unmarked += [f"{path.name}::{name}" for name in sorted(spawns) if name.startswith("test") and not whole
                     and "pytest.mark.integration" not in map(ast.unparse, defs[name].decorator_list)]
    assert not unmarked, unmarked


@pytest.mark.integration
def test_the_process_check_sees_each_process_a_test_starts():
    """conftest.py's check records what starts, through subprocess or multiprocessing, and not the quick tools
    or a program that is not there."""
    import subprocess
    import sys

    from helpers import processes_started

    with processes_started() as started:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        subprocess.run(["git", "--version"], capture_output=True, check=False)
        with pytest.raises(FileNotFoundError):
            subprocess.run(["/no/such/program"], check=False)
    assert started == [f"{sys.executable} -c pass"]


def test_outside_tracking_only_the_face_is_imported():
    """Code outside attnres/tracking/ imports the package's face (``from attnres.tracking import RunStore, ...``,
    its FACE) or its three public modules (run_store, records, states), never another tracking module."""
    from attnres import tracking

    public = {"attnres.tracking.run_store", "attnres.tracking.records", "attnres.tracking.states"}
    offenders = {}
    for name, tree in outside_tracking().items():
        bad = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "attnres.tracking":
                bad += [a.name for a in node.names
                        if a.name not in tracking.FACE and f"attnres.tracking.{a.name}" not in public]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnres.tracking."):
                bad += [node.module] if node.module not in public else []
            elif isinstance(node, ast.Import):
                bad += [a.name for a in node.names if a.name.startswith("attnres.tracking.") and a.name not in public]
        if bad:
            offenders[name] = bad
    assert not offenders, offenders
    assert set(tracking.__all__) == {*tracking.FACE, "records", "run_store", "states"}
    for name in tracking.FACE:  # every name of the face resolves
        assert getattr(tracking, name) is not None


def test_lower_layers_never_import_the_runs_layer():
    """The database, the variants, the model, the data and the training loop sit below attnres.runs (the verbs on
    runs and their backends): a pure helper they share with it lives below both (e.g. attnres.run_settings)."""
    lower = ("attnres.tracking", "attnres.variants", "attnres.model", "attnres.data", "attnres.training",
             "attnres.mirrors", "attnres.config", "attnres.run_settings", "attnres.conditions", "attnres.depth_keys")
    found = {name: sorted(i for i in imports_of(name, tree) if i.startswith(("attnres.runs", "attnres.bench")))
             for name, tree in modules(LIBRARY).items() if name.startswith(lower)}
    assert not {k: v for k, v in found.items() if v}


def test_backends_are_known_through_their_protocol_only():
    """Outside attnres/runs/backends/, no module imports one backend's own module (local, slurm, inline, or the
    local queue's run slots): status, the CLI, the reports and the verbs reach a backend's state through the
    Backend protocol (poll, unrecorded, waits, reconcile, ...) and its registry."""
    own = ("attnres.runs.backends.local", "attnres.runs.backends.slurm", "attnres.runs.backends.inline",
           "attnres.runs.backends.slots")
    found = {name: sorted(i for i in imports_of(name, tree) if i.startswith(own))
             for package in (LIBRARY, ROOT / "cli", ROOT / "reports") for name, tree in modules(package).items()
             if not name.startswith("attnres.runs.backends")}
    assert not {k: v for k, v in found.items() if v}


def test_the_database_package_starts_no_process():
    """attnres/tracking/ records and reads: a user's `--on-end` command is started, watched and waited for by
    attnres/on_end.py, told its facts by tracking (end_facts); no tracking module starts or signals a process."""
    process = ("subprocess", "signal", "multiprocessing")
    found = {name: sorted(i for i in imports_of(name, tree) if i.startswith(process))
             for name, tree in modules(LIBRARY).items() if name.startswith("attnres.tracking")}
    assert not {k: v for k, v in found.items() if v}
    assert "subprocess" in imports_of("attnres.on_end", modules(LIBRARY)["attnres.on_end"])  # (the check sees it)
