"""One training step: nothing read on the host between log steps, and the chunked loss trains
as the plain one does (and resumes bitwise)."""

from __future__ import annotations

import collections
import json
import traceback

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.train import loop as gtrain
from gptlab.train import runtime
from gptlab.train.config import build_config
from gptlab.train.metrics import read_metrics
from tests._tiny import TINY_TRAIN, interrupted_copy

TINY = [*TINY_TRAIN, "batch_size=4", "device=cpu", "dtype=float32"]
# what reads a tensor's value on the host: on a GPU each waits for the queued kernels
SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def _train(dataset, run, *extra, resume=False):
    return gtrain.train(build_config(None, [*TINY, *extra]), dataset, run, resume=resume)


def _losses(run):
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


@pytest.mark.parametrize(
    "extra",
    [
        ["optimizer=adamw"],
        ["optimizer=muon", "loss_impl=chunked"],  # clipping outside the fused update
        ["objective=mlm", "grad_clip=0"],
    ],
)
def test_no_step_between_log_steps_reads_a_tensor_on_the_host(dataset, tmp_path, monkeypatch, extra):
    """Every host read of a tensor (``.item()``, ``float(t)``, ``if t:`` …) is recorded with the step
    it happens in; only log, evaluation and checkpoint steps (every 4th here) may have any."""
    step = {"now": 0}
    reads: collections.Counter = collections.Counter()
    train_step = gtrain._Trainer.train_step

    def counted_step(self):
        step["now"] = self.step + 1
        return train_step(self)

    def watch(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if step["now"]:
                where = traceback.extract_stack()[-2]
                reads[(step["now"], f"{name} at {where.filename.split('/')[-1]}:{where.lineno}")] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    monkeypatch.setattr(gtrain._Trainer, "train_step", counted_step)
    for name in SYNCS:
        watch(name)
    _train(
        dataset, tmp_path / "run", "max_steps=8", "log_every=4", "eval_every=8", "ckpt_every=8", "grad_accum=2",
        *extra,
    )  # fmt: skip
    monkeypatch.undo()
    assert step["now"] == 8
    assert any(s == 4 for s, _ in reads)  # the watch works: the log step reads the losses
    between = {key: n for key, n in reads.items() if key[0] % 4}
    assert not between, between


def test_training_through_the_chunked_loss_matches_the_plain_one(dataset, tmp_path):
    common = ["max_steps=6", "eval_every=6", "model.vocab_multiple=64", "grad_accum=2"]
    plain = _train(dataset, tmp_path / "plain", *common, "loss_impl=plain")
    chunked = _train(dataset, tmp_path / "chunked", *common, "loss_impl=chunked")
    a, b = _losses(tmp_path / "plain"), _losses(tmp_path / "chunked")
    assert len(a) == len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5, (a, b)
    assert abs(plain.val_loss - chunked.val_loss) < 1e-5
    resolved = json.loads((tmp_path / "chunked" / gtrain.RUN_CONFIG_FILE).read_text())["resolved"]
    assert resolved["loss_impl"] == "chunked"


def test_a_chunked_run_resumes_bitwise(dataset, tmp_path):
    common = ["max_steps=6", "ckpt_every=3", "eval_every=3", "keep_last=5", "loss_impl=chunked"]
    _train(dataset, tmp_path / "full", *common)
    part = tmp_path / "part"
    cfg, data = interrupted_copy(tmp_path / "full", part, 3)
    gtrain.train(cfg, data, part, resume=True)
    full = ckpt.read_tensors(tmp_path / "full" / "ckpt-6" / ckpt.WEIGHTS_FILE)
    resumed = ckpt.read_tensors(part / "ckpt-6" / ckpt.WEIGHTS_FILE)
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert _losses(tmp_path / "full")[3:] == _losses(part)


@pytest.mark.slow  # a cold inductor compile of the forward and backward: ~20 s on 2 busy cores
def test_compiled_training_takes_the_chunked_loss_into_the_model_graph(dataset, tmp_path):
    if not runtime.can_compile("cpu"):
        pytest.skip("torch.compile needs a C++ compiler on CPU (none found)")
    import torch._dynamo.utils as dynamo_utils

    counters = dynamo_utils.counters
    common = ["max_steps=4", "eval_every=4", "loss_impl=chunked", "model.vocab_multiple=64"]
    _train(dataset, tmp_path / "eager", *common)
    ok, breaks = counters["frames"]["ok"], sum(counters["graph_break"].values())
    _train(dataset, tmp_path / "compiled", *common, "compile=true")
    assert counters["frames"]["ok"] > ok  # the step's forward ran as a compiled graph ...
    assert sum(counters["graph_break"].values()) == breaks  # ... with the loss inside it, unbroken
    a, b = _losses(tmp_path / "eager"), _losses(tmp_path / "compiled")
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4, (a, b)
