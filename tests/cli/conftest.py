"""Fixtures of the command tests: a prepared dataset and a run trained on it (module-scoped, so each
module that asks builds its own; a module that defines a fixture of the same name uses its own)."""

from __future__ import annotations

import pytest

from tests._tiny import TINY_TRAIN


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from gptlab.data import prepare

    root = tmp_path_factory.mktemp("cli")
    text = "\n".join(f"to be or not to be, line {i}; that is the question {i % 11}." for i in range(500))
    (root / "c.txt").write_text(text)
    prepare([root / "c.txt"], root / "ds", block_size=16)
    return root / "ds"


@pytest.fixture(scope="module")
def trained(dataset, tmp_path_factory):
    from gptlab.train import train
    from gptlab.train.config import build_config

    run = tmp_path_factory.mktemp("run") / "r"
    train(build_config(None, [*TINY_TRAIN, "batch_size=4", "max_steps=4", "eval_every=4"]), dataset, run)
    return run
