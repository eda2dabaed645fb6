"""The tiny model every test shares (``tiny_model``, also the fixture of that name), its character
vocabulary (``ALPHABET``, the ``char_tok`` fixture), and the settings of a one-layer model that trains in
milliseconds (``TINY_TRAIN``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gptlab.model import GPT

#: the tiny model's shape; a test passes only the settings it is about (``tiny_model(pos="rope")``)
TINY_MODEL: dict[str, Any] = dict(vocab_size=61, block_size=32, n_layer=2, n_head=4, n_embd=32)

#: the characters of the ``char_tok`` fixture (no special tokens: a request runs to its max_tokens)
ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:\n.,!?"


def tiny_model(*, seed: int = 0, jitter: float = 0.0, **overrides: Any) -> GPT:
    """``TINY_MODEL`` with ``overrides`` (any ``GPTConfig`` field; ``arch=`` gives an encoder or an
    encoder–decoder), seeded, float32, in eval mode. With ``jitter``, every parameter then moves by
    ``jitter·N(0, 1)`` (seeded too), so that norm weights and biases leave 1 and 0 and a mix-up shows."""
    import torch

    from gptlab.model import GPTConfig, build_model

    torch.manual_seed(seed)
    model = build_model(GPTConfig(**{**TINY_MODEL, **overrides})).float().eval()
    if jitter:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(jitter * torch.randn_like(p))
    return model


TINY_TRAIN = [
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "model.block_size=16",
    "threads=1",
    "progress=false",
    "eval_batches=2",
    "warmup_steps=2",
    "lr=3e-3",
]


def interrupted_copy(full: Path, part: Path, step: int):
    """A run stopped right after ``ckpt-STEP`` of ``full``: ``part`` holds that checkpoint and the run
    config only → ``(cfg, data)`` to resume it with (``gptlab.train.resolve_run(..., resume=True)``)."""
    from gptlab.train import loop as gtrain

    part.mkdir()
    shutil.copytree(full / f"ckpt-{step}", part / f"ckpt-{step}")
    shutil.copy(full / gtrain.RUN_CONFIG_FILE, part)
    return gtrain.resolve_run(part, None, True, None, [])
