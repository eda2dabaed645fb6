"""The training loop (gptlab.train): resume, accumulation, checkpoints, divergence, configs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.errors import GptlabError
from gptlab.model import GPT
from gptlab.train import loop as gtrain
from gptlab.train import runtime
from gptlab.train.config import TrainConfig, build_config, recipe_names
from gptlab.train.metrics import read_metrics
from gptlab.train.schedule import learning_rate
from tests._tiny import TINY_TRAIN, interrupted_copy

TINY = [*TINY_TRAIN, "batch_size=4"]
CPU_FP32 = ["device=cpu", "dtype=float32"]  # for tests that assert CPU float32 numerics


def _train(dataset, run, *extra, resume=False):
    cfg = build_config(None, [*TINY, *extra])
    return gtrain.train(cfg, dataset, run, resume=resume)


def _weights(path):
    return ckpt.read_tensors(ckpt.resolve_checkpoint(path) / ckpt.WEIGHTS_FILE)


def test_resume_is_bitwise_identical(dataset, tmp_path):
    common = ["max_steps=8", "ckpt_every=4", "eval_every=4", "keep_last=5", "model.dropout=0.1", *CPU_FP32]
    _train(dataset, tmp_path / "full", *common)
    # a run interrupted right after ckpt-4: its directory holds only that checkpoint
    part = tmp_path / "part"
    cfg, data = interrupted_copy(tmp_path / "full", part, 4)
    result = gtrain.train(cfg, data, part, resume=True)
    assert result.step == 8
    full, resumed = _weights(tmp_path / "full" / "ckpt-8"), _weights(part / "ckpt-8")
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    losses = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if "loss" in r}
    again = {r["step"]: r["loss"] for r in read_metrics(part / "metrics.jsonl") if "loss" in r}
    assert sorted(again) == [5, 6, 7, 8] and all(again[s] == losses[s] for s in again)
    opt_full, _ = ckpt.read_training_checkpoint(tmp_path / "full" / "ckpt-8")
    opt_part, _ = ckpt.read_training_checkpoint(part / "ckpt-8")
    assert torch.equal(
        opt_full["optimizer"]["adamw"]["state"][0]["exp_avg_sq"],
        opt_part["optimizer"]["adamw"]["state"][0]["exp_avg_sq"],
    )


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_grad_accumulation_matches_one_big_batch(dataset, tmp_path, optimizer):
    # CPU float32 numerics (auto would pick a GPU, or bf16 on a CPU that has it)
    common = ["max_steps=2", "eval_every=100", f"optimizer={optimizer}", "grad_clip=0.5", *CPU_FP32]
    _train(dataset, tmp_path / "big", *common, "batch_size=8", "grad_accum=1")
    _train(dataset, tmp_path / "acc", *common, "batch_size=4", "grad_accum=2")
    a, b = _weights(tmp_path / "big"), _weights(tmp_path / "acc")
    torch.manual_seed(build_config(None, TINY).seed)
    init = ckpt.model_state(
        GPT(ckpt.read_config(ckpt.resolve_checkpoint(tmp_path / "big") / ckpt.CONFIG_FILE))
    )
    assert all(not torch.allclose(a[k], init[k]) for k in a if k.endswith("qkv.weight"))  # the weights moved
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=2e-4, atol=2e-5)


def test_checkpoints_keep_last_and_best_and_records(dataset, tmp_path):
    run = tmp_path / "run"
    result = _train(dataset, run, "max_steps=6", "ckpt_every=1", "eval_every=2", "keep_last=2")
    steps = [s for s, _ in ckpt.list_checkpoints(run)]
    best = json.loads((run / gtrain.BEST_FILE).read_text())
    assert steps[-2:] == [5, 6] and set(steps) == {5, 6, best["step"]}
    assert (
        result.best_val_loss
        == best["val_loss"]
        == min(r["val_loss"] for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r)
    )
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    ev = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in ev] == [2, 4, 6]
    assert all(math.isclose(r["val_ppl"], math.exp(r["val_loss"])) for r in ev)
    assert (run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    model, tok = ckpt.load(run)  # a run directory loads its latest checkpoint
    assert model.config.block_size == 16 and tok.vocab_size == model.config.vocab_size
    assert not [p for p in run.iterdir() if p.name.startswith(".")]


def test_nan_stops_and_keeps_last_good_checkpoint(dataset, tmp_path, monkeypatch):
    original = gtrain._Trainer.train_step

    def poisoned(self):
        loss, norm = original(self)
        return (loss * float("nan"), norm) if self.step == 5 else (loss, norm)

    monkeypatch.setattr(gtrain._Trainer, "train_step", poisoned)
    with pytest.raises(GptlabError, match=r"diverged.*step 5.*ckpt-4"):
        _train(dataset, tmp_path / "run", "max_steps=10", "ckpt_every=2", "eval_every=100")
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "run")] == [2, 4]
    assert all(torch.isfinite(t).all() for t in _weights(tmp_path / "run").values())


def test_bf16_autocast_and_muon_learn(dataset, tmp_path):
    result = _train(
        dataset,
        tmp_path / "run",
        "max_steps=30",
        "eval_every=30",
        "dtype=bfloat16",
        "optimizer=muon",
        "muon_lr=0.02",
        "model.pos=rope",
        "model.norm=rmsnorm",
        "model.qk_norm=true",
    )
    assert result.val_loss is not None and result.val_loss < math.log(26) - 0.5  # well below uniform guessing


def test_new_run_refuses_existing_run_and_resume_needs_one(dataset, tmp_path):
    _train(dataset, tmp_path / "run", "max_steps=1")
    with pytest.raises(GptlabError, match="--resume"):
        gtrain.resolve_run(tmp_path / "run", dataset, False, None, [])
    with pytest.raises(GptlabError, match="no such run directory"):
        gtrain.resolve_run(tmp_path / "nope", dataset, True, None, [])
    cfg, _ = gtrain.resolve_run(tmp_path / "run", None, True, None, ["max_steps=2"])
    assert gtrain.train(cfg, dataset, tmp_path / "run", resume=True).step == 2
    with pytest.raises(GptlabError, match="model settings differ"):
        cfg, _ = gtrain.resolve_run(tmp_path / "run", None, True, None, ["max_steps=3", "model.n_layer=2"])
        gtrain.train(cfg, dataset, tmp_path / "run", resume=True)


def test_config_errors_list_valid_keys():
    with pytest.raises(GptlabError, match=r"unknown config key\(s\) bogus; valid keys: max_steps"):
        build_config(None, ["bogus=1"])
    with pytest.raises(GptlabError, match=r"unknown model key\(s\) nlayers; valid model keys: .*n_layer"):
        build_config(None, ["model.nlayers=2"])
    with pytest.raises(GptlabError, match="must be an integer"):
        build_config(None, ["max_steps=ten"])
    with pytest.raises(GptlabError, match="schedule must be one of"):
        TrainConfig(schedule="wiggly")
    assert build_config(None, ["lr=3e-3", "model.pos=rope", "compile=true"]).model == {"pos": "rope"}


def test_recipes_load():
    assert {"reference", "char-best"} <= set(recipe_names())
    for name in recipe_names():
        cfg = build_config(name)
        assert cfg.model_config(65).vocab_size == 65


def test_schedule_shapes():
    cosine = TrainConfig(schedule="cosine", lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=100)
    lrs = [learning_rate(t, cosine) for t in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(1e-4, rel=1e-2)
    linear = TrainConfig(
        schedule="linear", lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=100, warmdown_steps=20
    )
    lin = [learning_rate(t, linear) for t in range(100)]
    assert lin[79] == 1.0 and lin[99] == 0.0 and lin[89] == pytest.approx(0.5)


@pytest.mark.slow  # compiles the model's forward and backward: ~15 s on 2 busy cores
def test_compiled_training_matches_eager_and_keeps_checkpoint_names(dataset, tmp_path):
    if not runtime.can_compile("cpu"):
        pytest.skip("torch.compile needs a C++ compiler on CPU (none found)")
    eager = _train(dataset, tmp_path / "eager", "max_steps=6", "eval_every=6", *CPU_FP32)
    import torch._dynamo.utils as dynamo_utils

    frames = dynamo_utils.counters["frames"]
    before = frames["ok"]
    compiled = _train(
        dataset, tmp_path / "compiled", "max_steps=6", "eval_every=6", "compile=true", *CPU_FP32
    )
    assert frames["ok"] > before  # the training forward really ran as a compiled graph
    losses = [
        [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
        for run in (
            tmp_path / "eager",
            tmp_path / "compiled",
        )
    ]
    assert len(losses[0]) == len(losses[1]) == 6
    # the same arithmetic up to fusion's rounding: every step's loss agrees closely
    assert max(abs(a - b) for a, b in zip(*losses, strict=True)) < 1e-4, losses
    a, b = _weights(eager.checkpoint), _weights(compiled.checkpoint)
    assert a.keys() == b.keys()  # checkpoints hold the uncompiled model's parameter names
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-3


def test_compile_without_a_compiler_warns_and_trains_uncompiled(dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "can_compile", lambda device_type: False)
    with pytest.warns(UserWarning, match="needs a C\\+\\+ compiler"):
        result = _train(dataset, tmp_path / "run", "max_steps=2", "eval_every=2", "compile=true")
    assert result.step == 2


def test_clipping_inside_the_fused_update_equals_clip_grad_norm():
    from gptlab.model import GPTConfig
    from gptlab.train.optim import build_optimizer

    def model_with_grads() -> tuple[GPT, torch.Tensor]:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32))
        idx = torch.randint(0, 40, (4, 16))
        _, loss = model(idx, idx)
        (loss * 100).backward()  # a norm well above the clip
        return model, torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])

    clip = 0.5
    adamw = TrainConfig(optimizer="adamw", lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.99)
    muon = TrainConfig(optimizer="muon", lr=1e-2, weight_decay=0.1)
    a, norm = model_with_grads()
    opt_a = build_optimizer(a, adamw, "cpu")
    torch.nn.utils.clip_grad_norm_(a.parameters(), clip)
    opt_a.step()
    b, _ = model_with_grads()
    opt_b = build_optimizer(b, adamw, "cpu")
    assert opt_b.takes_grad_scale and norm > 10 * clip
    opt_b.step(((norm + 1e-6) / clip).clamp(min=1.0))
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, rtol=1e-6, atol=1e-7), name
    assert not build_optimizer(a, muon, "cpu").takes_grad_scale
