"""No test module imports another test module: a fixture shared within a package is in its
``conftest.py``, one shared across packages in ``tests/conftest.py``, and a helper in a ``_name.py``
module (CONTRIBUTING.md, Tests)."""

from __future__ import annotations

import ast

from tests import ROOT


def _imported_test_modules(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[-1].startswith("test_"):
                found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("test_")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if any(p.startswith("test_") for p in a.name.split("."))]
    return [name for name in found if name.startswith("tests.")]


def test_the_check_finds_a_test_module_imported():
    tree = ast.parse("from tests.cli import test_cli_train\nfrom tests.serve.test_serve_api import x\n")
    assert _imported_test_modules(tree) == ["tests.cli.test_cli_train", "tests.serve.test_serve_api"]


def test_no_test_module_imports_another():
    found = {
        str(path.relative_to(ROOT)): names
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if (names := _imported_test_modules(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert found == {}
