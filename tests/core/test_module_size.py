"""Small modules with one job each (DESIGN.md): no source file of the package over 400 lines."""

from __future__ import annotations

from tests import ROOT

LIMIT = 400
PACKAGE = ROOT / "src" / "gptlab"


def test_no_module_is_over_400_lines():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
        for pattern in ("*.py", "*.js")
        for path in PACKAGE.rglob(pattern)
    }
    assert len(sizes) > 100  # the package was found
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}
