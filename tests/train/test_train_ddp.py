"""DDP under torchrun: 2 CPU processes (gloo) equal one process on the same global batch (the ranks with
activation checkpointing, the single process without)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.data import prepare
from gptlab.train import train
from gptlab.train.config import build_config
from tests._tiny import TINY_TRAIN

TINY = [*TINY_TRAIN, "max_steps=3", "eval_every=3"]


@pytest.mark.slow  # two torchrun processes start torch: ~35 s on 2 busy cores
def test_two_process_gloo_equals_single_process(tmp_path):
    text = "\n".join(f"line {i}: the cat sat on mat number {i % 13} and purred." for i in range(500))
    (tmp_path / "c.txt").write_text(text)
    prepare([tmp_path / "c.txt"], tmp_path / "ds", block_size=16)
    recipe = tmp_path / "tiny.toml"  # the same plain float32 AdamW config for both runs
    recipe.write_text('dtype = "float32"\ndevice = "cpu"\n[model]\npreset = "char-tiny"\n')
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            *launcher,
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "gptlab",
            "train",
            "--data",
            str(tmp_path / "ds"),
            "--out",
            str(tmp_path / "ddp"),
            "--config",
            str(recipe),
            *TINY,
            "batch_size=2",
            "activation_checkpointing=blocks",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = train(build_config(str(recipe), [*TINY, "batch_size=4"]), tmp_path / "ds", tmp_path / "one")
    a = ckpt.read_tensors(ckpt.resolve_checkpoint(tmp_path / "ddp") / ckpt.WEIGHTS_FILE)
    b = ckpt.read_tensors(ckpt.resolve_checkpoint(tmp_path / "one") / ckpt.WEIGHTS_FILE)
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    # the evaluation is shared across ranks and reduced: the same val loss as one process
    assert ckpt.read_json(tmp_path / "ddp" / "best.json")["val_loss"] == pytest.approx(
        single.val_loss, rel=1e-4
    )
