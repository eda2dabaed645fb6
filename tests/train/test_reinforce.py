"""Reinforcement from a reward (``objective = "grpo"``): the group advantage, the loss against a direct
computation, a constant reward that moves nothing, reward errors, resuming, and a reward that rises."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptlab import checkpoint as ckpt
from gptlab.checkpoint.lora import ADAPTERS_FILE
from gptlab.cli import main
from gptlab.data.prompts import PromptDataset, prepare_prompts
from gptlab.errors import GptlabError
from gptlab.model.lora import LoRASpec, adapters_disabled, apply_lora, lora_layers
from gptlab.sources import load_source, model_tokenizer
from gptlab.tokenizers import CharTokenizer
from gptlab.train import train
from gptlab.train.config import build_config
from gptlab.train.objectives import make_objective
from gptlab.train.reinforce import (
    RewardFunction,
    completion_rows,
    group_advantages,
    policy_loss,
    sample_completions,
    token_logprobs,
)
from tests._kill import kill_and_resume
from tests._tiny import TINY_TRAIN, tiny_model

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 \n"
REWARDS = '''
import math

def fraction(prompt, completion, example):
    """The share of the example's chosen character in the completion."""
    return completion.count(example["answer"]) / max(len(completion), 1)

def constant(prompt, completion):
    return 1.0

CALLS = [0]

def _late(value):
    CALLS[0] += 1
    return value() if CALLS[0] > 40 else 0.5  # steps 1-2 (16 completions each) pass, step 3 fails

def raises(prompt, completion):
    return _late(lambda: 1 / 0)

def nan(prompt, completion):
    return _late(lambda: math.nan)

def text(prompt, completion):
    return _late(lambda: "good")

def three(a, b, c, d):
    return 0.0
'''
SETTINGS = [t for t in TINY_TRAIN if not t.startswith("model.")] + [
    "objective=grpo",
    "batch_size=4",
    "group_size=4",
    "rl_max_new_tokens=8",
    "eval_batches=1",
    "weight_decay=0",
]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A tiny 'pretrained' chat model, 40 prompts whose answer is the character 'a', and reward functions."""
    root = tmp_path_factory.mktemp("grpo")
    tok = CharTokenizer.from_text(ALPHABET, special_tokens=SPECIALS)
    model = tiny_model(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, pos="rope", jitter=0.02)
    ckpt.save(model, tok, root / "base")
    records = [{"prompt": f"q{i}", "answer": "a"} for i in range(40)]
    (root / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    prepare_prompts(
        [root / "p.jsonl"], root / "ds", tokenizer=str(root / "base"), model_tokenizer=model_tokenizer
    )
    (root / "rewards.py").write_text(REWARDS)
    return root


def _settings(task, fn, *extra):
    return [*SETTINGS, f"init={task / 'base'}", f"reward={task / 'rewards.py'}:{fn}", *extra]


# ---------------------------------------------------------------- the maths
def test_group_advantages():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 2.0, 3.0]])
    centred = group_advantages(r, standardise=False)
    assert torch.allclose(centred, r - r.mean(1, keepdim=True))
    assert torch.allclose(centred.sum(1), torch.zeros(3))
    scaled = group_advantages(r, standardise=True)
    assert torch.equal(scaled[1], torch.zeros(4)) and torch.equal(centred[1], torch.zeros(4))  # no signal
    std = r.std(1, unbiased=False)
    assert torch.allclose(scaled[[0, 2]], centred[[0, 2]] / (std[[0, 2], None] + 1e-4))
    assert torch.allclose(scaled[[0, 2]].std(1, unbiased=False), torch.ones(2), atol=1e-3)


def test_loss_against_a_direct_computation():
    policy = tiny_model(jitter=0.05)
    reference = tiny_model(seed=1, jitter=0.05)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    completions = [[11, 12], [13, 14, 15, 16], [17], [18, 19, 20]]
    A = torch.tensor([0.5, -1.0, 2.0, -0.25])
    x, y = completion_rows(prompts, completions, pad=0)
    assert [y[i][y[i] >= 0].tolist() for i in range(4)] == completions
    logp = token_logprobs(policy(x), y)
    with torch.no_grad():
        ref = token_logprobs(reference(x), y)
    loss, kl = policy_loss(logp, A, y >= 0, ref, kl_coef=0.3)
    pg, k3, n = 0.0, 0.0, 0
    for p, c, a in zip(prompts, completions, A.tolist(), strict=True):
        seq = torch.tensor([p + c])
        with torch.no_grad():
            lp = F.log_softmax(policy(seq[:, :-1])[0].double(), -1)
            lr = F.log_softmax(reference(seq[:, :-1])[0].double(), -1)
        for k, tok in enumerate(c):
            t = len(p) - 1 + k  # the position that predicts completion token k
            pg += a * float(lp[t, tok])
            d = float(lr[t, tok] - lp[t, tok])
            k3 += np.exp(d) - d - 1
            n += 1
    assert loss.item() == pytest.approx(-pg / n + 0.3 * k3 / n, rel=1e-5, abs=1e-6)
    assert kl.item() == pytest.approx(k3 / n, rel=1e-5) and kl.item() > 0
    loss.backward()  # the gradient flows into the policy only
    assert all(p.grad is not None for p in policy.parameters() if p.requires_grad)


def test_adapters_disabled_is_the_base_model():
    base = tiny_model(jitter=0.05)
    model = apply_lora(tiny_model(jitter=0.05), LoRASpec(rank=2, targets=["qkv", "attn.proj"]))
    for layer in lora_layers(model).values():
        torch.nn.init.normal_(layer.lora_B)
    x = torch.randint(0, 61, (2, 12))
    with torch.no_grad():
        adapted = model(x)
        with adapters_disabled(model):
            off = model(x)
        again = model(x)
    assert torch.equal(off, base(x).detach())
    assert not torch.allclose(adapted, off) and torch.equal(adapted, again)  # restored after the block


# ---------------------------------------------------------------- the objective
def test_batches_samples_and_step_metrics_are_keyed_by_step(task):
    cfg = build_config(None, _settings(task, "fraction", "finetune=lora", "kl_coef=0.1"))
    objective = make_objective(cfg, task / "ds")
    model = objective.start.model  # LoRA applied by the loop; here the base, adapters applied by hand
    from gptlab.train.init import finetune_model

    model = finetune_model(objective.start, cfg).train()
    b = objective.batch(3, 0, "cpu")
    assert torch.equal(b[0], objective.batch(3, 0, "cpu")[0]) and b[1].tolist() == [3, 0]
    other = make_objective(cfg, task / "ds", rank=1, world_size=2).batch(3, 0, "cpu")[0]
    mine = make_objective(cfg, task / "ds", rank=0, world_size=2).batch(3, 0, "cpu")[0]
    assert not set(other.tolist()) & set(mine.tolist())  # each rank its own prompts
    first = objective.loss(model, b)
    metrics = objective.step_metrics()
    assert objective.step_metrics() == {}  # reset after each call
    again = objective.loss(model, b)
    assert torch.equal(first, again) and objective.step_metrics() == metrics  # the same draw: resumable
    assert set(metrics) == {"reward", "reward_std", "completion_len", "kl", "zero_adv_frac"}
    assert 0 <= metrics["reward"] <= 1 and 0 <= metrics["zero_adv_frac"] <= 1
    assert 1 <= metrics["completion_len"] <= 8
    assert metrics["kl"] == 0.0  # B = 0 at the start: the policy is its reference, k3 = 0 exactly
    objective.loss(model, objective.batch(4, 0, "cpu"))
    assert objective.step_metrics() != metrics  # another step draws other completions


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_constant_reward_leaves_the_weights_unchanged(task, tmp_path, finetune):
    extra = ["max_steps=3", "lr=1e-2", f"finetune={finetune}", "eval_every=100"]
    result = train(build_config(None, _settings(task, "constant", *extra)), task / "ds", tmp_path / "c")
    if finetune == "lora":  # B starts at 0 and a zero advantage leaves it there
        adapters = ckpt.read_tensors(result.checkpoint / ADAPTERS_FILE)
        assert all(not v.any() for k, v in adapters.items() if k.endswith("lora_B"))
        return
    before, after = load_source(task / "base")[0].state_dict(), load_source(result.checkpoint)[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the control: a reward that differs within groups moves them
    moved = train(build_config(None, _settings(task, "fraction", *extra)), task / "ds", tmp_path / "m")
    changed = load_source(moved.checkpoint)[0].state_dict()
    assert any(not torch.equal(before[k], changed[k]) for k in before)


@pytest.mark.parametrize(
    ("fn", "why"), [("raises", "raised ZeroDivisionError"), ("nan", "returned nan"), ("text", "returned str")]
)
def test_a_failing_reward_is_one_error_line_and_keeps_the_checkpoint(task, tmp_path, capsys, fn, why):
    run = tmp_path / "run"
    argv = ["train", "--data", str(task / "ds"), "--out", str(run)]
    code = main([*argv, *_settings(task, fn, "max_steps=6", "ckpt_every=2", "eval_every=100")])
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("hardware:")]
    assert code == 2 and len(lines) == 1, lines
    err = lines[0]
    assert (
        err.startswith(f"error: reward function {task / 'rewards.py'}:{fn} {why}") and "train prompt" in err
    )
    assert [path.name for _, path in ckpt.list_checkpoints(run)] == ["ckpt-2"]
    assert load_source(run)[0] is not None  # the kept checkpoint loads


def test_reward_function_loading_errors(task, tmp_path):
    with pytest.raises(GptlabError, match="no such file"):
        RewardFunction(f"{tmp_path / 'none.py'}:f")
    with pytest.raises(GptlabError, match="has no function 'missing'"):
        RewardFunction(f"{task / 'rewards.py'}:missing")
    with pytest.raises(GptlabError, match=r"must take \(prompt, completion\)"):
        RewardFunction(f"{task / 'rewards.py'}:three")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(GptlabError, match="failed to import: SyntaxError"):
        RewardFunction(f"{tmp_path / 'broken.py'}:f")
    assert RewardFunction(f"{task / 'rewards.py'}:fraction")(
        "q", "aab", {"answer": "a"}, "x"
    ) == pytest.approx(2 / 3)
    for bad, what in (
        (["group_size=1"], "group_size"),
        (["kl_coef=-1"], "kl_coef"),
        (["strategy=fsdp"], "ddp"),
    ):
        with pytest.raises(GptlabError, match=what):
            build_config(None, _settings(task, "fraction", *bad))
    with pytest.raises(GptlabError, match="needs reward="):
        build_config(None, [*SETTINGS])


def _sampled_reward(model, data, n=64):
    prompts = [data.prompt_ids("val", i % data.count("val")) for i in range(n)]
    out = sample_completions(
        model, prompts, max_new_tokens=8, temperature=1.0, stop_tokens=[0], seeds=range(n)
    )
    return np.mean([data.tokenizer.decode(c).count("a") / max(len(c), 1) for c in out])


def test_mean_reward_rises_on_a_tiny_task(task, tmp_path):
    extra = ["max_steps=30", "lr=1e-2", "finetune=full", "eval_every=15", "kl_coef=0.01"]
    result = train(build_config(None, _settings(task, "fraction", *extra)), task / "ds", tmp_path / "r")
    data = PromptDataset(task / "ds")
    before = _sampled_reward(load_source(task / "base")[0], data)
    after = _sampled_reward(load_source(result.checkpoint)[0], data)
    assert after > before + 0.3, (before, after)
    records = [json.loads(x) for x in open(tmp_path / "r" / "metrics.jsonl")]
    evals = [r for r in records if "val_loss" in r]
    assert evals[-1]["val_loss"] < -0.5  # −(held-out mean reward), greedy
    assert evals[-1]["val_reward"] == pytest.approx(-evals[-1]["val_loss"]) and "val_ppl" not in evals[-1]
    steps = [r for r in records if "loss" in r]  # the objective's step_metrics, logged by the loop
    assert {"reward", "reward_std", "completion_len", "kl", "zero_adv_frac"} <= set(steps[0])
    assert np.mean([r["reward"] for r in steps[-5:]]) > np.mean([r["reward"] for r in steps[:5]]) + 0.2


# ---------------------------------------------------------------- resuming and DDP
def _launch(task, run, *extra, resume=False):
    argv = [sys.executable, "-m", "gptlab", "train", "--out", str(run), *_settings(task, "fraction", *extra)]
    argv += ["--resume"] if resume else ["--data", str(task / "ds")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_lora_grpo_survives_sigkill_bitwise(task, tmp_path):
    extra = [
        "finetune=lora",
        "lora_dropout=0.1",
        "kl_coef=0.05",
        "max_steps=14",
        "ckpt_every=2",
        "eval_every=7",
        "lr=1e-2",
    ]
    # `gptlab train init=...` starts from the finetune recipe, as the reference does here
    reference = train(
        build_config("finetune", _settings(task, "fraction", *extra)), task / "ds", tmp_path / "ref"
    )
    run = tmp_path / "run"
    kill_and_resume(lambda resume: _launch(task, run, *extra, resume=resume), run, kills=2, most_steps=4)
    final = ckpt.resolve_checkpoint(run)
    a = ckpt.read_tensors(final / ADAPTERS_FILE)
    b = ckpt.read_tensors(reference.checkpoint / ADAPTERS_FILE)
    assert final.name == "ckpt-14" and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # killed and resumed = never interrupted, bitwise


@pytest.mark.slow
def test_grpo_under_ddp_ends_in_a_checkpoint(task, tmp_path):
    from tests.train._torchrun import finish, torchrun_train

    run = tmp_path / "ddp"
    extra = ["finetune=lora", "kl_coef=0.05", "max_steps=4", "ckpt_every=2", "eval_every=2", "lr=1e-2"]
    finish(
        torchrun_train(
            2, ["--data", str(task / "ds"), "--out", str(run), *_settings(task, "fraction", *extra)]
        )
    )
    assert ckpt.resolve_checkpoint(run).name == "ckpt-4"
    assert load_source(run)[0] is not None


# ---------------------------------------------------------------- the shipped task
def _shipped_task(name: str) -> tuple[list[dict], RewardFunction]:
    """``evals/rl/<name>.jsonl`` as records, checked to be what ``make_<name>.py`` writes (deterministic),
    and its reward function."""
    import importlib.util
    from pathlib import Path

    here = Path(__file__).resolve().parents[2] / "evals" / "rl"
    spec = importlib.util.spec_from_file_location(f"make_{name}", here / f"make_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (here / f"{name}.jsonl").read_text(encoding="utf-8")
    shipped = [json.loads(line) for line in text.splitlines()]
    assert shipped == module.records()  # regenerated deterministically
    return shipped, RewardFunction(f"{here / f'{name}_reward.py'}:reward")


def test_the_shipped_addition_task_is_its_script_output_and_its_reward_checks_it():
    shipped, reward = _shipped_task("addition")
    for record in shipped[:50]:
        a, b = map(int, re.findall(r"\d+", record["prompt"]))
        assert reward("", f" {a + b}.", record, "x") == 1.0
        assert reward("", f"{a} + {b} = {a + b}", record, "x") == 0.5
        assert reward("", f"{a + b + 1}", record, "x") == 0.0  # the format alone earns nothing
        assert reward("", f"It is {a + b + 1}", record, "x") == 0.0


def test_the_shipped_reading_task_is_its_script_output_and_its_reward_checks_it():
    shipped, reward = _shipped_task("reading")
    assert len({r["prompt"] for r in shipped}) == len(shipped)
    for record in shipped[:50]:
        n1, n2 = re.findall(r"\d+", record["prompt"])
        asked, other = (n1, n2) if record["answer"] == n1 else (n2, n1)
        assert record["answer"] == asked and asked != other
        assert reward("", f" {asked}.", record, "x") == 1.0
        assert reward("", f"Mia has {asked} cups.", record, "x") == 0.3
        assert reward("", other, record, "x") == 0.0  # the format alone earns nothing
        assert reward("", f"{other} and {asked}", record, "x") == 0.0


def test_the_shipped_capitals_task_is_its_script_output_and_its_reward_checks_it():
    shipped, reward = _shipped_task("capitals")
    questions = [r["messages"][-1]["content"] for r in shipped]
    assert len(set(questions)) == len(shipped) >= 100
    assert all(r["messages"][-1]["role"] == "user" for r in shipped)  # a chat that ends on the question
    assert not any("France" in q for q in questions)  # the worked example is never asked
    records = {r["answer"]: r for r in shipped}
    lima, rome = records["Lima"], records["Rome"]
    assert reward("", " Lima.", lima, "x") == 1.0
    assert reward("", "LIMA", lima, "x") == 1.0  # case aside
    assert reward("", "Bogota", records["Bogotá|Bogota"], "x") == 1.0  # accents aside, other spellings
    assert reward("", "Bogotá.", records["Bogotá|Bogota"], "x") == 1.0
    sentence = reward("", "The capital of Peru is Lima.", lima, "x")
    short = reward("", "Lima, Peru.", lima, "x")
    assert 0 < sentence < short < 1.0  # right, wrong format: more the shorter
    assert reward("", "Rome", lima, "x") == 0.0  # a wrong city alone earns nothing
    assert reward("", "The capital of Peru is Cusco.", lima, "x") == 0.0
    assert reward("", "Romeo", rome, "x") == 0.0  # the name, not a longer word holding it
