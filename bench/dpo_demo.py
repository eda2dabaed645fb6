"""DPO on SmolLM2-135M-Instruct with LoRA, on gptlab's own preference set (``evals/data/preference.jsonl``):
held-out reward accuracy before and after, by kind of flaw, and the time of a DPO step against an SFT step
of the same batch. Prints one JSON line.

    python bench/dpo_demo.py [--work DIR] [--steps 16] [--batch 4] [--lr 1e-3] [--timing-repeats 5]
        [--tasks gptlab_choice,gptlab_rolling,gptlab_gen]

The run is the Fine-tuning guide's commands::

    gptlab prepare evals/data/preference.jsonl --format preference --out WORK/data --tokenizer smollm2 \\
        --block-size 127
    gptlab train --config dpo --data WORK/data --out WORK/run init=smollm2 model.block_size=127 \\
        max_steps=STEPS batch_size=BATCH lr=LR warmup_steps=2 'lora_targets=["qkv","proj","gate","up"]'

Held out: the 60 ``val`` pairs, whose questions the 300 training pairs never ask. For each, the policy
(the run's last checkpoint, adapters merged) and the reference (SmolLM2 itself) score both answers
(``gptlab.train.preference.sequence_logprobs``). ``before``: the implicit reward of the starting model is
0 for every answer, so every pair is a tie (50 %); ``reference_prefers_chosen`` says how often SmolLM2
itself gives the chosen answer the higher log-probability (summed, and per token). ``after``: the share of pairs
with r(y_w) > r(y_l), overall and per flaw (wrong / rude / rambling).

``lm_eval``: what the tuning cost elsewhere. lm-evaluation-harness scores the ``evals/`` tasks (all of their
items: 40 + 10 + 12) for SmolLM2 (``before``) and for the run (``after``, the adapters merged), in-process, in
float32, as ``bench/lmeval_finetune.py`` does (its ``evaluate``); ``change`` is after − before per metric.
``--tasks ""`` leaves them out.

The timing alternates SFT and DPO steps (forward, backward and AdamW) on the same batch of 2·TIMING_BATCH
sequences: SFT's masked cross-entropy on them, DPO's loss plus the reference pass with adapters off. After one
warm-up step each, TIMING_REPEATS of each are timed; the medians of wall time and of the process's CPU time
(all threads) are reported, with the load average before and after (a shared machine stretches wall time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
TARGETS = '["qkv","proj","gate","up"]'
SOURCE = ROOT / "evals" / "data" / "preference.jsonl"


def settings(args: argparse.Namespace) -> list[str]:
    return [
        "init=smollm2", "model.block_size=127", f"max_steps={args.steps}", f"batch_size={args.batch}",
        f"lr={args.lr}", "min_lr=1e-4", "warmup_steps=2", f"lora_targets={TARGETS}", f"eval_every={args.steps}",
        f"ckpt_every={args.steps}", "eval_batches=1", "progress=false",
    ]  # fmt: skip


def held_out(policy, reference, data, flaws: list[str], batch: int) -> dict[str, object]:
    """Reward accuracy of ``policy`` against ``reference`` on the val pairs, overall and per flaw, and the
    reference's own preference."""
    import numpy as np
    import torch

    from gptlab.train.preference import sequence_logprobs

    n = data.pairs("val")
    pol, ref, tokens = [], [], []
    with torch.no_grad():
        for s in range(0, n, batch):
            x, y = data.batch("val", np.arange(s, min(s + batch, n)))
            k = x.size(0) // 2
            p, r = sequence_logprobs(policy(x), y), sequence_logprobs(reference(x), y)
            pol.append(torch.stack([p[:k], p[k:]], 1))
            ref.append(torch.stack([r[:k], r[k:]], 1))
            counts = (y != -1).sum(1)
            tokens.append(torch.stack([counts[:k], counts[k:]], 1))
    P, R, T = torch.cat(pol).double(), torch.cat(ref).double(), torch.cat(tokens).double()
    margin = (P[:, 0] - R[:, 0]) - (P[:, 1] - R[:, 1])
    correct = (margin > 0).double() + 0.5 * (margin == 0).double()
    by = {
        f: round(float(correct[[i for i, g in enumerate(flaws) if g == f]].mean()), 4)
        for f in sorted(set(flaws))
    }
    return {
        "reward_accuracy": round(float(correct.mean()), 4),
        "by_flaw": by,
        "margin_mean": round(float(margin.mean()), 3),
        "logp_chosen_mean": round(float(P[:, 0].mean()), 2),
        "logp_rejected_mean": round(float(P[:, 1].mean()), 2),
        "reference_prefers_chosen": round(float((R[:, 0] > R[:, 1]).double().mean()), 4),
        "reference_prefers_chosen_per_token": round(
            float(((R[:, 0] / T[:, 0]) > (R[:, 1] / T[:, 1])).double().mean()), 4
        ),
    }


def step_times(cfg, data_dir: Path, repeats: int) -> dict[str, object]:
    """Median seconds (wall and CPU) of a DPO step and an SFT step (forward, backward, AdamW) on the same
    batch, alternated."""
    import torch

    from gptlab.train import init
    from gptlab.train.objectives import make_objective

    objective = make_objective(cfg, data_dir)
    model = init.finetune_model(objective.start, cfg).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    batch = objective.batch(0, 0, "cpu")

    def dpo() -> None:
        objective.loss(model, batch).backward()

    def sft() -> None:
        model(batch[0], batch[1])[1].backward()

    wall: dict[str, list[float]] = {"dpo": [], "sft": []}
    cpu: dict[str, list[float]] = {"dpo": [], "sft": []}
    load_before = os.getloadavg()[0]
    for i in range(repeats + 1):  # the first of each warms up
        for name, step in (("sft", sft), ("dpo", dpo)):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            opt.step()
            opt.zero_grad()
            if i:
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    out: dict[str, object] = {}
    for clock, times in (("wall", wall), ("cpu", cpu)):
        dpo_s, sft_s = statistics.median(times["dpo"]), statistics.median(times["sft"])
        out[clock] = {"dpo_step_s": round(dpo_s, 3), "sft_step_s": round(sft_s, 3), "dpo_over_sft": round(dpo_s / sft_s, 3),
                      "dpo_all_s": [round(t, 3) for t in times["dpo"]], "sft_all_s": [round(t, 3) for t in times["sft"]]}  # fmt: skip
    return {**out, "repeats": repeats, "sequences_per_step": int(batch[0].size(0)),
            "tokens_per_step": int(batch[0].numel()), "threads": torch.get_num_threads(),
            "load_1min_before": round(load_before, 2), "load_1min_after": round(os.getloadavg()[0], 2)}  # fmt: skip


def cpu_kind() -> str:
    """The CPU's model name (Linux), else the platform's processor string."""
    import platform

    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def change(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """``after − before`` for every metric of every task both scored."""
    return {
        task: {m: round(after[task][m] - v, 6) for m, v in row.items() if m in after.get(task, {})}
        for task, row in before.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=None, help="keep the data and the run here")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch", type=int, default=4, help="pairs per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--timing-repeats", type=int, default=5, help="timed DPO and SFT steps each, after one warm-up"
    )
    p.add_argument("--timing-batch", type=int, default=2, help="pairs in the timed steps' batch")
    p.add_argument(
        "--tasks",
        default="gptlab_choice,gptlab_rolling,gptlab_gen",
        help='lm-eval tasks from evals/ to score before and after ("" for none)',
    )
    args = p.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gptlab
    from gptlab.data.preference import PreferenceDataset, prepare_preference
    from gptlab.sources import load_source, model_tokenizer
    from gptlab.train import train
    from gptlab.train.config import build_config
    from gptlab.train.metrics import read_metrics

    work = args.work or Path(tempfile.mkdtemp(prefix="dpo-demo-"))
    data_dir, run = work / "data", work / f"run-{args.steps}x{args.batch}-{args.lr:g}"
    if not (data_dir / "meta.json").exists():
        prepare_preference(
            [SOURCE], data_dir, tokenizer="smollm2", block_size=127, model_tokenizer=model_tokenizer
        )
    cfg = build_config("dpo", settings(args))
    out: dict[str, object] = {
        "steps": args.steps,
        "pairs_per_step": args.batch,
        "lr": args.lr,
        "finetune": "lora",
    }
    train_s = None
    if not (run / f"ckpt-{args.steps}").exists():
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # the run's evaluation line: stdout holds the JSON only
            train(cfg, data_dir, run)
        train_s = round(time.perf_counter() - t0, 1)
    out["train_wall_s"] = train_s
    steps = [r for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    out["train_first"] = {k: round(steps[0][k], 4) for k in ("loss", "reward_accuracy")}
    out["train_last"] = {k: round(steps[-1][k], 4) for k in ("loss", "reward_accuracy", "reward_margin")}
    data = PreferenceDataset(data_dir)
    flaws = [json.loads(line)["flaw"] for line in SOURCE.read_text().splitlines() if '"split": "val"' in line]
    base, _ = load_source("smollm2")
    tuned, _ = gptlab.load(run)  # the adapters merged into their base
    base.eval()
    tuned.eval()
    after = held_out(tuned, base, data, flaws, args.batch)
    out["before"] = {  # the starting policy is the reference: every reward is 0, every pair a tie
        "reward_accuracy": 0.5,
        "reference_prefers_chosen": after.pop("reference_prefers_chosen"),
        "reference_prefers_chosen_per_token": after.pop("reference_prefers_chosen_per_token"),
    }
    out["after"] = after
    del tuned
    timing = argparse.Namespace(**{**vars(args), "batch": args.timing_batch})
    out["timing"] = step_times(build_config("dpo", settings(timing)), data_dir, args.timing_repeats)
    if args.tasks:
        from lmeval_finetune import evaluate

        tasks = args.tasks.split(",")
        t0 = time.perf_counter()
        scores = {
            name: evaluate("gptlab", f"pretrained={src},dtype=fp32,device=cpu", tasks)
            for name, src in (("before", "smollm2"), ("after", str(run)))
        }
        out["lm_eval"] = {
            **scores,
            "change": change(scores["before"], scores["after"]),
            "wall_s": round(time.perf_counter() - t0, 1),
        }
    out["cpu"] = cpu_kind()
    out["threads"] = int(__import__("torch").get_num_threads())
    out["load_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
