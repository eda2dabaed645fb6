"""One job per module (DESIGN.md): every module says its job first, and a long one is a prompt to look.

The rule is a module's job, not a line count: a module splits along a seam, never to get under a
number. Past ``CEILING`` lines a module has very likely grown a second job, so the ceiling fails this
test and asks for the seam (a module that is long for a reason can say so by being split where the
reason lies).
"""

from __future__ import annotations

import ast

from tests import ROOT

CEILING = 600
PACKAGE = ROOT / "src" / "gptlab"


def test_no_module_passes_the_ceiling():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
        for pattern in ("*.py", "*.js")
        for path in PACKAGE.rglob(pattern)
    }
    assert len(sizes) > 100  # the package was found
    assert {name: n for name, n in sizes.items() if n > CEILING} == {}


def test_every_module_states_its_job_in_its_docstring():
    silent = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree)
        if not doc or len(doc.split()) < 4:  # a sentence, not a word
            silent.append(str(path.relative_to(PACKAGE)))
    assert silent == []
