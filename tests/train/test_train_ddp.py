"""DDP under torchrun: 2 CPU processes (gloo) equal one process on the same global batch (the ranks with
activation checkpointing, the single process without)."""

from __future__ import annotations

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.train import train
from gptlab.train.config import build_config
from tests._tiny import TINY_TRAIN
from tests.train._torchrun import finish, line_dataset, torchrun_train

TINY = [*TINY_TRAIN, "max_steps=3", "eval_every=3"]


@pytest.mark.slow  # two torchrun processes start torch: ~35 s on 2 busy cores
def test_two_process_gloo_equals_single_process(tmp_path):
    ds = line_dataset(tmp_path)
    recipe = tmp_path / "tiny.toml"  # the same plain float32 AdamW config for both runs
    recipe.write_text('dtype = "float32"\ndevice = "cpu"\n[model]\npreset = "char-tiny"\n')
    args = ["--data", str(ds), "--out", str(tmp_path / "ddp"), "--config", str(recipe), *TINY]
    finish(torchrun_train(2, [*args, "batch_size=2", "activation_checkpointing=blocks"]))
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
