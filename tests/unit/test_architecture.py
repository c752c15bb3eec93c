"""The package's shape (STYLE.md): no import cycle between any two modules of `inflight`, and the
layers contracts of pyproject's `[tool.importlinter]` kept (web edge → proxy → consumers →
engine → base; the engine free of web, HTTP and usage imports)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(name)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert cycles(graph) == [["a.x", "a.y"]]


def test_no_import_cycles_in_inflight() -> None:
    """Type-checking-only imports aside (they never run), no module reaches itself: a
    function-level import to dodge a cycle would still count here."""
    graph = grimp.build_graph("inflight", exclude_type_checking_imports=True)
    assert cycles(graph) == []


def test_the_layers_contracts_are_kept() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "import-linter is a test dependency"
    done = subprocess.run(
        [lint], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "BROKEN" not in done.stdout


def test_module_docstrings_are_one_to_five_lines() -> None:
    """Every module says what it is for in one to five lines (STYLE.md rule 10); the detail
    belongs to the class or function it explains."""
    offenders = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        lines = 0 if doc is None else len(doc.strip().splitlines())
        if not 1 <= lines <= 5:
            offenders.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert offenders == [], "module docstrings not of 1-5 lines:\n" + "\n".join(offenders)
