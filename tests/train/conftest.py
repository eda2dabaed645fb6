"""Fixtures of the training tests: a tiny prepared dataset of word lines (module-scoped, so each module
that asks builds its own; a module that defines a fixture of the same name uses its own)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from gptlab.data import prepare

    root = tmp_path_factory.mktemp("data")
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
    text = "\n".join(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(9)) for i in range(600))
    (root / "c.txt").write_text(text)
    prepare([root / "c.txt"], root / "ds", block_size=16)
    return root / "ds"
