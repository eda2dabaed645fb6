"""DPO (objective = "dpo", gptlab.train.preference): the loss, the reference, learning, resuming."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptlab import checkpoint as ckpt
from gptlab.checkpoint.lora import ADAPTERS_FILE
from gptlab.data.preference import PreferenceDataset, prepare_preference
from gptlab.errors import GptlabError
from gptlab.model.lora import LoRASpec, adapters_disabled, apply_lora
from gptlab.sources import model_tokenizer
from gptlab.tokenizers import CharTokenizer
from gptlab.train import train
from gptlab.train.config import build_config
from gptlab.train.metrics import read_metrics
from gptlab.train.objectives import make_objective
from gptlab.train.preference import reference_logprobs, sequence_logprobs, stored_references
from tests._chat_data import ALPHABET, SPECIALS, write_jsonl
from tests._kill import kill_and_resume
from tests._tiny import TINY_TRAIN, tiny_model

SETTINGS = [t for t in TINY_TRAIN if not t.startswith("model.")]


def _pair(i: int) -> dict:
    return {"prompt": f"what is {i}?", "chosen": f"it is {i}.", "rejected": "go away"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A small 'pretrained' chat model (char tokenizer with ChatML's tokens) and 64 pairs prepared for it."""
    root = tmp_path_factory.mktemp("dpo")
    tok = CharTokenizer.from_text(ALPHABET, special_tokens=SPECIALS)
    model = tiny_model(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, pos="rope", jitter=0.02)
    ckpt.save(model, tok, root / "base")
    write_jsonl(root / "pairs.jsonl", [_pair(i) for i in range(64)])
    prepare_preference(
        [root / "pairs.jsonl"],
        root / "ds",
        tokenizer=str(root / "base"),
        model_tokenizer=model_tokenizer,
        block_size=63,
        val_fraction=0.25,
    )
    return root


def _cfg(base, *extra):
    return build_config("dpo", [*SETTINGS, f"init={base / 'base'}", "model.block_size=63", *extra])


def _logp_direct(model, x, y):
    """Σ over the answer tokens of log p, from a model's logits, written out."""
    logits = model(x)
    logp = torch.log_softmax(logits.double(), -1).gather(-1, y.clamp(min=0)[..., None])[..., 0]
    return (logp * (y != -1)).sum(-1)


def test_the_loss_equals_a_direct_computation_from_two_forward_passes(base):
    cfg = _cfg(base, "finetune=full", "batch_size=3", "beta=0.3", "label_smoothing=0.1")
    objective = make_objective(cfg, base / "ds")
    policy = copy.deepcopy(objective.start.model).train()  # the model moves; the reference stays the start
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x, y, ref = objective.batch(0, 0, "cpu")
    loss = objective.loss(policy, (x, y, ref))
    B = 3
    start = objective.start.model  # the initial weights, whose log-probabilities were stored
    # two separate passes each, chosen and rejected
    w_pol, l_pol = _logp_direct(policy, x[:B], y[:B]), _logp_direct(policy, x[B:], y[B:])
    w_ref, l_ref = _logp_direct(start, x[:B], y[:B]), _logp_direct(start, x[B:], y[B:])
    z = 0.3 * ((w_pol - w_ref) - (l_pol - l_ref))
    expected = (-(0.9) * F.logsigmoid(z) - 0.1 * F.logsigmoid(-z)).mean()
    assert torch.allclose(loss.double(), expected, atol=1e-5)
    assert torch.allclose(ref.double(), torch.cat([w_ref, l_ref]), atol=1e-4)  # the stored reference
    metrics = objective.step_metrics()
    assert float(metrics["reward/chosen"]) == pytest.approx(
        float((0.3 * (w_pol - w_ref)).mean().detach()), abs=1e-4
    )
    assert float(metrics["reward_margin"]) == pytest.approx(float(z.mean().detach()), abs=1e-4)
    assert objective.step_metrics() == {}  # reset after each step
    # the gradient is the direct loss's gradient
    loss.backward()
    direct = copy.deepcopy(policy)
    direct.zero_grad()
    w, l_ = _logp_direct(direct, x[:B], y[:B]), _logp_direct(direct, x[B:], y[B:])
    z = 0.3 * ((w - w_ref) - (l_ - l_ref))
    (-(0.9) * F.logsigmoid(z) - 0.1 * F.logsigmoid(-z)).mean().backward()
    for (name, a), b in zip(policy.named_parameters(), direct.parameters(), strict=True):
        assert torch.allclose(a.grad.double(), b.grad.double(), atol=1e-6), name


def test_the_reference_with_adapters_off_is_the_base_model_exactly(base):
    model, _ = ckpt.load(base / "base")
    lora = apply_lora(copy.deepcopy(model), LoRASpec(rank=4, targets=["qkv", "attn.proj", "fc"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.normal_()  # adapters that change the function
    data = PreferenceDataset(base / "ds")
    x, y = data.batch("train", np.arange(6))
    lora.train()
    base_logp = sequence_logprobs(model(x), y)
    assert torch.equal(reference_logprobs(lora, x, y), base_logp)  # bitwise
    assert not torch.allclose(sequence_logprobs(lora(x), y), base_logp)  # the adapters are back on after
    assert lora.training
    with adapters_disabled(lora):
        assert torch.equal(sequence_logprobs(lora(x), y), base_logp)


def test_dpo_raises_reward_accuracy_on_a_tiny_preference_set(base, tmp_path):
    cfg = _cfg(
        base,
        "max_steps=30",
        "batch_size=8",
        "lr=1e-2",
        "beta=0.5",
        "eval_every=30",
        "eval_batches=2",
        'lora_targets=["qkv","attn.proj","fc","mlp.proj"]',
    )
    result = train(cfg, base / "ds", tmp_path / "run")
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    assert steps[0]["reward_accuracy"] == 0.5  # LoRA starts at B = 0: every reward is 0, a tie
    assert np.mean([r["reward_accuracy"] for r in steps[-5:]]) >= 0.9
    assert steps[-1]["loss"] < 0.5 * steps[0]["loss"]
    evals = [r for r in records if "val_loss" in r][-1]
    assert evals["val_reward_accuracy"] >= 0.9 and "val_bpb" not in evals
    assert evals["val_reward_chosen"] > evals["val_reward_rejected"]
    assert (tmp_path / "run" / "loss.png").is_file()
    # the run ends in a normal checkpoint: it loads as a model that samples
    import gptlab

    model, tok = gptlab.load(result.checkpoint)  # the adapters merged into their base
    out = model(torch.tensor([tok.encode("what is 3?")]))
    assert out.shape[-1] == model.config.vocab_size


def test_full_finetuning_stores_the_reference_per_model(base, tmp_path):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(base / "ds", ds)
    train(
        _cfg(base, "finetune=full", "max_steps=2", "lr=1e-4", "eval_every=2", "eval_batches=1"),
        ds,
        tmp_path / "r1",
    )
    stored = stored_references(ds)
    assert len(stored) == 1
    made = stored[0].stat().st_mtime_ns
    train(
        _cfg(base, "finetune=full", "max_steps=2", "lr=1e-4", "eval_every=2", "eval_batches=1"),
        ds,
        tmp_path / "r2",
    )
    assert stored_references(ds) == stored and stored[0].stat().st_mtime_ns == made  # reused, not recomputed
    # another starting model (the first run's end) gets its own
    model, tok = ckpt.load(tmp_path / "r1")
    ckpt.save(model, tok, tmp_path / "other")
    cfg = build_config(
        "dpo",
        [*SETTINGS, f"init={tmp_path / 'other'}", "model.block_size=63", "finetune=full", "max_steps=1"],
    )
    train(cfg, ds, tmp_path / "r3")
    assert len(stored_references(ds)) == 2


def test_settings_are_checked(base):
    with pytest.raises(GptlabError, match="beta must be positive"):
        _cfg(base, "beta=0")
    with pytest.raises(GptlabError, match="label_smoothing must be in"):
        _cfg(base, "label_smoothing=0.5")
    with pytest.raises(GptlabError, match="needs init"):
        make_objective(build_config("dpo", [*SETTINGS, "finetune=full"]), base / "ds")


# ---------------------------------------------------------------- killed and resumed
def _launch(base, run, *extra, resume=False):
    argv = [sys.executable, "-m", "gptlab", "train", "--out", str(run), "--config", "dpo", *SETTINGS, *extra]
    argv += ["--resume"] if resume else ["--data", str(base / "ds")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_dpo_survives_sigkill_bitwise(base, tmp_path, finetune):
    settings = [
        f"init={base / 'base'}",
        f"finetune={finetune}",
        "model.block_size=63",
        "max_steps=12",
        "ckpt_every=2",
        "keep_last=2",
        "eval_every=6",
        "eval_batches=1",
        "lr=1e-3",
        "dtype=float32",
        "device=cpu",
    ]
    reference = train(build_config("dpo", [*SETTINGS, *settings]), base / "ds", tmp_path / "ref")
    run = tmp_path / "run"
    kill_and_resume(lambda resume: _launch(base, run, *settings, resume=resume), run, kills=2, most_steps=4)
    final = ckpt.resolve_checkpoint(run)
    name = ADAPTERS_FILE if finetune == "lora" else ckpt.WEIGHTS_FILE
    a, b = ckpt.read_tensors(final / name), ckpt.read_tensors(reference.checkpoint / name)
    assert final.name == "ckpt-12" and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # killed and resumed = never interrupted, bitwise
    ref_log = {r["step"]: r for r in read_metrics(tmp_path / "ref" / "metrics.jsonl") if "loss" in r}
    run_log = {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if "loss" in r}
    assert sorted(run_log) == sorted(ref_log)
    assert all(run_log[s]["reward_accuracy"] == ref_log[s]["reward_accuracy"] for s in ref_log)


@pytest.mark.slow  # two torchrun processes start torch
def test_two_gloo_ranks_equal_one_process(base, tmp_path):
    from tests.train._torchrun import finish, torchrun_train

    settings = [
        *SETTINGS,
        f"init={base / 'base'}",
        "model.block_size=63",
        "max_steps=3",
        "eval_every=3",
        "eval_batches=2",
        "lr=1e-2",
        "dtype=float32",
        "device=cpu",
    ]
    finish(
        torchrun_train(
            2,
            [
                "--data",
                str(base / "ds"),
                "--out",
                str(tmp_path / "ddp"),
                "--config",
                "dpo",
                *settings,
                "batch_size=2",
            ],
        )
    )
    single = train(build_config("dpo", [*settings, "batch_size=4"]), base / "ds", tmp_path / "one")
    a = ckpt.read_tensors(ckpt.resolve_checkpoint(tmp_path / "ddp") / ADAPTERS_FILE)
    b = ckpt.read_tensors(single.checkpoint / ADAPTERS_FILE)
    assert sorted(a) == sorted(b)
    for k in a:  # each rank's pairs, gradients averaged = the same pairs in one process
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    ddp_eval = [r for r in read_metrics(tmp_path / "ddp" / "metrics.jsonl") if "val_loss" in r][-1]
    assert ddp_eval["val_loss"] == pytest.approx(single.val_loss, rel=1e-4)
    one_eval = [r for r in read_metrics(tmp_path / "one" / "metrics.jsonl") if "val_loss" in r][-1]
    assert ddp_eval["val_reward_accuracy"] == one_eval["val_reward_accuracy"]
