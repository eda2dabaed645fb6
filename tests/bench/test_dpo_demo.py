"""``bench/dpo_demo.py``'s pieces on a tiny chat model: the held-out reward accuracy, the step timing, the
lm-eval change."""

from __future__ import annotations

import argparse
import copy
import statistics

import numpy as np
import pytest
import torch

from bench import dpo_demo
from gptlab import checkpoint as ckpt
from gptlab.data.preference import PreferenceDataset, prepare_preference
from gptlab.sources import model_tokenizer
from gptlab.tokenizers import CharTokenizer
from gptlab.train.config import build_config
from gptlab.train.preference import sequence_logprobs
from tests._chat_data import ALPHABET, SPECIALS, write_jsonl
from tests._tiny import TINY_TRAIN, tiny_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo-demo")
    tok = CharTokenizer.from_text(ALPHABET, special_tokens=SPECIALS)
    model = tiny_model(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, pos="rope", jitter=0.02)
    ckpt.save(model, tok, root / "base")
    pairs = [
        {
            "prompt": f"what is {i}?",
            "chosen": f"it is {i}.",
            "rejected": "go away" + "!" * (i % 3),
            "split": split,
        }
        for i, split in enumerate(["train"] * 8 + ["val"] * 10)
    ]
    write_jsonl(root / "pairs.jsonl", pairs)
    prepare_preference(
        [root / "pairs.jsonl"], root / "ds", tokenizer=str(root / "base"), model_tokenizer=model_tokenizer,
        block_size=63,
    )  # fmt: skip
    return root


def _direct(policy, reference, data):
    x, y = data.batch("val", np.arange(data.pairs("val")))
    k = x.size(0) // 2
    with torch.no_grad():
        p, r = sequence_logprobs(policy(x), y).double(), sequence_logprobs(reference(x), y).double()
    return (p[:k] - r[:k]) - (p[k:] - r[k:]), r[:k] > r[k:]


def test_held_out_is_the_reward_accuracy_of_the_pairs_by_flaw(base):
    data = PreferenceDataset(base / "ds")
    reference, _ = ckpt.load(base / "base")
    reference.eval()
    flaws = ["a", "b"] * 5
    same = dpo_demo.held_out(reference, reference, data, flaws, batch=3)
    assert same["reward_accuracy"] == 0.5 and same["margin_mean"] == 0  # the reference against itself: ties
    assert same["by_flaw"] == {"a": 0.5, "b": 0.5}
    policy = copy.deepcopy(reference)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.2 * torch.randn_like(p, generator=torch.Generator().manual_seed(p.numel())))
    margin, ref_prefers = _direct(policy, reference, data)
    assert (margin != 0).all()
    out = dpo_demo.held_out(policy, reference, data, flaws, batch=3)  # batches of 3 pairs, the last of 1
    assert out["reward_accuracy"] == pytest.approx(float((margin > 0).double().mean()), abs=1e-4)
    assert out["by_flaw"]["a"] == pytest.approx(float((margin[0::2] > 0).double().mean()), abs=1e-4)
    assert out["margin_mean"] == pytest.approx(float(margin.mean()), abs=1e-3)
    assert out["reference_prefers_chosen"] == pytest.approx(float(ref_prefers.double().mean()), abs=1e-4)
    swapped = dpo_demo.held_out(
        reference, policy, data, flaws, batch=4
    )  # the roles swapped: the margin flips
    assert swapped["reward_accuracy"] == pytest.approx(1 - out["reward_accuracy"], abs=1e-4)


def test_step_times_alternates_both_steps_on_one_batch(base):
    settings = [t for t in TINY_TRAIN if not t.startswith("model.")]
    cfg = build_config(
        "dpo",
        [*settings, f"init={base / 'base'}", "model.block_size=63", "batch_size=2", 'lora_targets=["qkv"]'],
    )
    out = dpo_demo.step_times(cfg, base / "ds", repeats=2)
    assert out["sequences_per_step"] == 4 and out["repeats"] == 2
    for clock in ("wall", "cpu"):
        row = out[clock]
        assert len(row["dpo_all_s"]) == len(row["sft_all_s"]) == 2
        assert row["dpo_step_s"] > 0 and row["sft_step_s"] > 0
        for step in ("dpo", "sft"):  # each median of its timed steps, rounded to 1 ms
            assert row[f"{step}_step_s"] == pytest.approx(statistics.median(row[f"{step}_all_s"]), abs=1.5e-3)
        dpo, sft = row["dpo_step_s"], row["sft_step_s"]
        assert (dpo - 5e-4) / (sft + 5e-4) - 1e-3 <= row["dpo_over_sft"] <= (dpo + 5e-4) / (sft - 5e-4) + 1e-3


def test_change_is_after_minus_before_for_metrics_both_have():
    before = {"t": {"acc,none": 0.7, "word_perplexity,none": 100.0}, "u": {"acc,none": 0.5}}
    after = {"t": {"acc,none": 0.75, "word_perplexity,none": 150.5}}
    assert dpo_demo.change(before, after) == {"t": {"acc,none": 0.05, "word_perplexity,none": 50.5}, "u": {}}


def test_settings_are_the_guides_command():
    args = argparse.Namespace(steps=8, batch=4, lr=1e-3)
    cfg = build_config("dpo", dpo_demo.settings(args))
    assert cfg.objective == "dpo" and cfg.max_steps == 8 and cfg.batch_size == 4 and cfg.finetune == "lora"
    assert cfg.model["block_size"] == 127 and sorted(cfg.lora_targets) == ["gate", "proj", "qkv", "up"]
