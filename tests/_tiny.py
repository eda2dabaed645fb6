"""Settings shared by the training tests: a one-layer model that trains in milliseconds."""

import shutil
from pathlib import Path

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
