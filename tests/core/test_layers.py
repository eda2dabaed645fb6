"""The layers hold (docs/design/layers.md): no import cycle, the import-linter contracts kept, and no
private name (``_x``) imported from another module. Imports inside functions count: grimp reads them."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT

grimp = pytest.importorskip("grimp")
importlinter = pytest.importorskip("importlinter")

SRC = ROOT / "src"
PACKAGE = SRC / "gptlab"


def _graph():
    return grimp.build_graph("gptlab", cache_dir=None)


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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


def test_the_cycle_finder_finds_a_cycle():
    class Graph:
        modules = {"a", "b", "c", "d"}
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, m):
            return self.edges.get(m, set())

    assert _cycles(Graph()) == [["a", "b", "c"]]


def test_no_module_imports_itself_through_others():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (imports inside functions included):\n" + "\n".join(map(str, cycles))


def test_the_import_linter_contracts_are_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.skip("lint-imports is not installed (pip install import-linter)")
    root = SRC.parent
    env = {"PYTHONPATH": str(SRC), "PATH": str(Path(sys.executable).parent)}
    result = subprocess.run([exe, "--no-cache"], cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_crossings(path: Path) -> list[str]:
    """``from gptlab.x import _y``, ``import gptlab.x._y`` and ``gptlab.x._y`` / ``alias._y`` (an alias of a
    gptlab module) where ``gptlab.x`` is another module than ``path``'s own."""
    here = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name → the gptlab module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gptlab" or node.module.startswith("gptlab."):
                for a in node.names:
                    if node.module != here and _private(a.name):
                        found.append(f"{node.lineno}: from {node.module} import {a.name}")
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "gptlab" or a.name.startswith("gptlab."):
                    parts = a.name.split(".")
                    if any(_private(p) for p in parts[1:]):
                        found.append(f"{node.lineno}: import {a.name}")
                    aliases[a.asname or parts[0]] = a.name if a.asname else "gptlab"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases:
                owner = ".".join([aliases[inner.id], *reversed(chain[1:])])
                if owner != here:
                    found.append(f"{node.lineno}: {owner}.{node.attr}")
    return found


def test_the_private_name_scanner_finds_each_form(tmp_path):
    pkg = tmp_path / "gptlab"
    pkg.mkdir()
    f = pkg / "mod.py"
    f.write_text(
        "from gptlab.other import _hidden, public\n"
        "import gptlab.other._inner\n"
        "from gptlab import other as o\n"
        "from gptlab import mod\n"
        "o._x; public._y; mod._fine; gptlab.__version__\n"
    )
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        found = private_crossings(f)
    finally:
        SRC = saved
    assert [x.split(": ", 1)[1] for x in found] == [
        "from gptlab.other import _hidden",
        "import gptlab.other._inner",
        "gptlab.other._x",
        "gptlab.other.public._y",
    ]


def test_no_private_name_crosses_a_module_boundary():
    crossings = {
        str(path.relative_to(SRC)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if (found := private_crossings(path))
    }
    assert not crossings, "private names used from another module:\n" + "\n".join(
        f"{p}:{line}" for p, lines in crossings.items() for line in lines
    )
