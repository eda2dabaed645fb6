"""FSDP under SIGKILL: every rank killed at random moments (mid-step, mid-checkpoint), twice, then
resumed, ends bitwise equal to an uninterrupted FSDP run of the default recipe (Muon across ranks)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.checkpoint.integrity import verify_checksums
from tests._kill import kill_tree, steps_logged
from tests.train._torchrun import final_weights, finish, line_dataset, torchrun_train

SETTINGS = [
    "dtype=float32",
    "device=cpu",
    "threads=1",
    "progress=false",
    "model.n_layer=2",
    "model.n_embd=64",
    "model.block_size=16",
    "max_steps=12",
    "warmup_steps=4",
    "warmdown_steps=6",
    "eval_every=1000",
    "eval_batches=2",
    "ckpt_every=2",
    "keep_last=3",
    "log_every=1",
    "batch_size=2",
    "strategy=fsdp",
]


@pytest.mark.slow
def test_fsdp_killed_twice_and_resumed_is_bitwise_the_uninterrupted_run(tmp_path):
    ds = line_dataset(tmp_path)
    finish(torchrun_train(2, ["--data", str(ds), "--out", str(tmp_path / "full"), *SETTINGS]))
    run, rng = tmp_path / "run", random.Random(0)
    for attempt in range(2):
        args = ["--out", str(run), "--resume"] if attempt else ["--data", str(ds), "--out", str(run)]
        proc = torchrun_train(2, [*args, *SETTINGS])
        target = (
            steps_logged(run) + rng.randint(2, 4) if (run / "metrics.jsonl").exists() else rng.randint(3, 5)
        )
        deadline = time.monotonic() + 200
        while proc.poll() is None and steps_logged(run) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        assert proc.poll() is None, "the run ended before it could be killed"
        kill_tree(proc.pid)  # every rank and the agent, SIGKILL
        proc.communicate()
        latest = ckpt.list_checkpoints(run)
        assert latest and latest[-1][0] < 12
        assert verify_checksums(latest[-1][1])  # the newest complete checkpoint is whole
    proc = torchrun_train(2, ["--out", str(run), "--resume", *SETTINGS])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    full, resumed = final_weights(tmp_path / "full", tmp_path, "a"), final_weights(run, tmp_path, "b")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
