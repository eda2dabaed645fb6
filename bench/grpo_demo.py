"""Reinforcement from a verifiable reward on SmolLM2-135M-Instruct: held-out accuracy before and after.

    python bench/grpo_demo.py                                   # the full demonstration (≤ 15 min target)
    python bench/grpo_demo.py --steps 2 --held-out 8 --group 4  # a short check that it runs

The default task is ``evals/rl/capitals.jsonl`` (``evals/rl/make_capitals.py`` writes it): a chat with one
worked example ("What is the capital of France? Reply with the city name only." → "Paris"), then the
question for one of 122 other countries, a fifth held out; its reward ``evals/rl/capitals_reward.py:reward``
gives 1 for the capital alone, ``0.5·4/(4 + words)`` for it inside a longer reply, 0 otherwise (no credit
for the format alone). Greedy, SmolLM2 is right for a fifth of the held-out countries; the rest are a
wrong city or the right one run on into more words, which the reward teaches it to drop. Four runs (two
learning rates, three seeds) each gained 28–48 points (docs/benchmarks.md); ``--seed`` picks the run.
``--task reading`` (counts in a sentence) and ``--task addition`` (two-digit sums, beyond SmolLM2-135M)
are the tasks tried before, and the capitals without the worked example before them (docs/benchmarks.md).
The pipeline is the user's:
``prepare --format prompts`` (a held-out split), then ``train objective=grpo finetune=lora`` from the
``finetune`` recipe, then the run loaded (adapters merged). Accuracy is the share of held-out prompts (never
trained on) whose greedy reply passes the task's ``correct`` check (the answer alone).

Sampling throughput: generated tokens per second inside the RL loop (every call of
``sample_completions`` during training, prefill included, timed), against ``bench/generate.py``'s
measurement (``run_once``: prefill + decode, no stop) on the same model at the same batch
(``batch·group`` rows), prompt length and new tokens. Prints ONE JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from bench.dpo_demo import cpu_kind  # noqa: E402
from bench.generate import run_once  # noqa: E402
from gptlab.data.prompts import PromptDataset, prepare_prompts  # noqa: E402
from gptlab.sources import load_source, model_tokenizer  # noqa: E402
from gptlab.train import reinforce, train  # noqa: E402
from gptlab.train.config import build_config  # noqa: E402

TASKS = {
    "reading": "reading",
    "addition": "addition",
    "capitals": "capitals",
}  # --task: evals/rl/<name>.jsonl, <name>_reward.py


def accuracy(
    model: torch.nn.Module, data: PromptDataset, n: int, max_new: int, reward: Path
) -> tuple[float, float, list[str]]:
    """``(exact-match accuracy, mean reward, replies)`` of greedy replies to the first ``n`` held-out prompts."""
    fn = reinforce.RewardFunction(f"{reward}:reward")
    mean, texts = reinforce.held_out_reward(model, data, fn, "val", max_new_tokens=max_new, batch=8, limit=n)
    check = reinforce.RewardFunction(f"{reward}:correct")  # (completion, answer) → bool
    hits = [check.fn(t, data.record("val", i)[1]["answer"]) for i, t in enumerate(texts)]
    return sum(hits) / len(hits), mean, texts


def lone_numbers(texts: list[str]) -> float:
    """The share of replies that are one number alone, right or wrong (the format, apart from the answer)."""
    alone = [bool(re.fullmatch(r"\d+", t.strip().removesuffix(".").strip())) for t in texts]
    return sum(alone) / max(len(alone), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="capitals", choices=sorted(TASKS), help="evals/rl/<task>.jsonl")
    p.add_argument("--source", default="smollm2", help="the model to tune (anything init= takes)")
    p.add_argument("--steps", type=int, default=45)
    p.add_argument("--batch", type=int, default=2, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-new", type=int, default=12, help="rl_max_new_tokens")
    p.add_argument("--temperature", type=float, default=1.0, help="rl_temperature")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--kl", type=float, default=0.0, help="kl_coef")
    p.add_argument("--held-out", type=int, default=25, help="held-out prompts scored before and after")
    p.add_argument("--val-fraction", type=float, default=0.2, help="the share of prompts held out")
    p.add_argument("--seed", type=int, default=1337, help="the run's seed (prompt order, sampling)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", help="directory for the dataset and the run (default: a temporary one)")
    args = p.parse_args()
    task = ROOT / "evals" / "rl" / f"{TASKS[args.task]}.jsonl"
    reward = ROOT / "evals" / "rl" / f"{TASKS[args.task]}_reward.py"
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    t_all = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="grpo-demo-"))
    prepare_prompts(
        [task],
        work / "ds",
        tokenizer=args.source,
        model_tokenizer=model_tokenizer,
        val_fraction=args.val_fraction,
        block_size=128,
    )
    data = PromptDataset(work / "ds")
    base, _ = load_source(args.source)
    t = time.perf_counter()
    before, reward_before, texts_before = accuracy(base, data, args.held_out, args.max_new, reward)
    score_s = time.perf_counter() - t

    # bench/generate.py's measurement on this model at the loop's batch and shapes
    rows = args.batch * args.group
    prompt = data.prompt_ids("val", 0)
    run_once(base, [prompt] * rows, 2)  # warm-up
    pf, dc, n = run_once(base, [prompt] * rows, args.max_new)
    generate_tps = n / (pf + dc)
    del base

    timed = {"s": 0.0, "tokens": 0, "calls": 0}
    original = reinforce.sample_completions

    def sample_timed(*a: object, **kw: object) -> list[list[int]]:
        t0 = time.perf_counter()
        out = original(*a, **kw)  # type: ignore[arg-type]
        timed["s"] += time.perf_counter() - t0
        timed["tokens"] += sum(len(c) for c in out)
        timed["calls"] += 1
        return out

    reinforce.sample_completions = sample_timed  # type: ignore[assignment]
    settings = [
        f"init={args.source}",
        "objective=grpo",
        f"reward={reward}:reward",
        "finetune=lora",
        f"max_steps={args.steps}",
        f"batch_size={args.batch}",
        f"group_size={args.group}",
        f"rl_max_new_tokens={args.max_new}",
        f"rl_temperature={args.temperature}",
        f"lr={args.lr}",
        f"min_lr={args.lr / 10}",
        f"kl_coef={args.kl}",
        "warmup_steps=2",
        f"eval_every={args.steps}",
        "eval_batches=1",
        f"ckpt_every={args.steps}",
        f"threads={args.threads}",
        f"seed={args.seed}",
        "progress=false",
    ]
    result = train(build_config("finetune", settings), work / "ds", work / "run")
    loop_samples = dict(timed)
    reinforce.sample_completions = original
    tuned, _ = load_source(work / "run")
    after, reward_after, texts_after = accuracy(tuned, data, args.held_out, args.max_new, reward)
    print(
        json.dumps(
            {
                "source": args.source,
                "task": f"evals/rl/{TASKS[args.task]}.jsonl",
                "steps": args.steps,
                "batch": args.batch,
                "group": args.group,
                "max_new_tokens": args.max_new,
                "temperature": args.temperature,
                "lr": args.lr,
                "kl_coef": args.kl,
                "seed": args.seed,
                "held_out": min(args.held_out, data.count("val")),
                "accuracy_before": round(before, 3),
                "accuracy_after": round(after, 3),
                "accuracy_gain_points": round(100 * (after - before), 1),
                "mean_reward_before": round(reward_before, 3),
                "mean_reward_after": round(reward_after, 3),
                "train_wall_s": round(result.train_wall_s, 1),
                "step_s": round(result.train_wall_s / max(result.step, 1), 2),
                "score_held_out_s": round(score_s, 1),
                "total_wall_s": round(time.perf_counter() - t_all, 1),
                "loop_sample_tokens_per_s": round(loop_samples["tokens"] / max(loop_samples["s"], 1e-9), 2),
                "loop_sample_share_of_step": round(loop_samples["s"] / max(result.train_wall_s, 1e-9), 3),
                "generate_bench_tokens_per_s": round(generate_tps, 2),
                "generate_rows": rows,
                "lone_number_before": round(lone_numbers(texts_before), 3),
                "lone_number_after": round(lone_numbers(texts_after), 3),
                "replies_after": texts_after[:3],
                "cpu": cpu_kind(),
                "threads": args.threads,
                "loadavg_at_start": round(load_start, 2),
                "loadavg_at_end": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
