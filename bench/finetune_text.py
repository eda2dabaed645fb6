"""Plain-text fine-tuning: how far LoRA lowers a pretrained model's validation loss in a few minutes of CPU.

    python bench/finetune_text.py --init SRC [--data FILE] [--steps 60] [--context 256] [key=value ...]

The text is prepared with the model's own tokenizer (``prepare --tokenizer SRC``), the pretrained
model's validation loss is measured on fixed held-out windows (``--eval-batches`` × ``--eval-batch-size``
windows of ``--eval-context`` tokens, whatever the training context), the model is fine-tuned with
the ``finetune`` recipe (LoRA) plus the given overrides on windows of ``--context`` tokens, and the
same held-out windows are measured again. So are as many held-out tokens cut into windows of the
training context (``*_train_context``: what the run's own validation loss sees), before and after.
``train_wall_s`` counts the training steps only (the loop's own clock: no evaluation, no
checkpoints); ``train_cpu_s`` is the CPU time of every thread over the whole ``train`` call
(loading the base included), the steadier figure on a shared machine.
Prints ONE JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"


def val_loss(model: Any, data: Any, context: int, batches: int, batch_size: int) -> float:
    """Mean loss over the same ``batches·batch_size`` validation windows every time."""
    from gptlab.data import eval_batches
    from gptlab.evaluate.loss import loss_sum

    total, count = loss_sum(model, eval_batches(data.split("val"), context, batch_size, batches), "cpu")
    return float(total) / count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--eval-batch-size", type=int, default=4)
    ap.add_argument("--eval-context", type=int, default=256)
    ap.add_argument("--work", help="keep the prepared text here and reuse it (default: a temporary folder)")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args()

    import torch

    import gptlab
    from gptlab.data import TokenDataset, prepare
    from gptlab.sources import load_source, model_tokenizer
    from gptlab.train import train
    from gptlab.train.config import build_config
    from gptlab.train.metrics import METRICS_FILE, read_metrics

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ds = Path(args.work or tmp) / "ds"
        if not (ds / "meta.json").exists():
            prepare(
                [args.data],
                ds,
                tokenizer=args.init,
                block_size=max(args.context, args.eval_context),
                model_tokenizer=model_tokenizer,
            )
        data = TokenDataset(ds)
        # the same number of held-out tokens at --eval-context and at the training context
        windows = {
            ctx: (ctx, args.eval_batches, max(1, args.eval_batch_size * args.eval_context // ctx))
            for ctx in dict.fromkeys((args.eval_context, args.context))
        }
        base, _ = load_source(args.init)
        with torch.no_grad():
            before = {ctx: val_loss(base.eval(), data, *held) for ctx, held in windows.items()}
        del base
        settings = [
            f"init={args.init}",
            f"model.block_size={args.context}",
            f"max_steps={args.steps}",
            f"batch_size={args.batch_size}",
            f"eval_every={args.steps}",
            "eval_batches=1",
            f"ckpt_every={args.steps}",
            "progress=false",
            *args.overrides,
        ]
        cfg = build_config("finetune", settings)
        cpu0 = time.process_time()
        result = train(cfg, data.dir, Path(tmp) / "run")
        train_cpu = time.process_time() - cpu0  # every thread's CPU time, loading the base included
        losses = [r["loss"] for r in read_metrics(Path(tmp) / "run" / METRICS_FILE) if "loss" in r]
        tuned, _ = gptlab.load(Path(tmp) / "run")
        with torch.no_grad():
            after = {ctx: val_loss(tuned, data, *held) for ctx, held in windows.items()}
    print(
        json.dumps(
            {
                "bench": "finetune_text",
                "init": args.init,
                "data": Path(args.data).name,
                "finetune": cfg.finetune,
                "lora_rank": cfg.lora_rank,
                "lora_alpha": cfg.lora_alpha,
                "lora_targets": cfg.lora_targets,
                "lr": cfg.lr,
                "lora_lr_ratio": cfg.lora_lr_ratio,
                "schedule": cfg.schedule,
                "warmup_steps": cfg.warmup_steps,
                "steps": result.step,
                "batch_size": args.batch_size,
                "context": args.context,
                "eval_windows": f"{args.eval_batches * args.eval_batch_size} x {args.eval_context}",
                "base_val_loss": round(before[args.eval_context], 4),
                "val_loss": round(after[args.eval_context], 4),
                "drop_nats": round(before[args.eval_context] - after[args.eval_context], 4),
                # the same text cut into windows of the training context (what the run's own val loss sees)
                "train_context_windows": f"{args.eval_batches * windows[args.context][2]} x {args.context}",
                "base_val_loss_train_context": round(before[args.context], 4),
                "val_loss_train_context": round(after[args.context], 4),
                "drop_nats_train_context": round(before[args.context] - after[args.context], 4),
                "train_loss_per_10_steps": [
                    round(sum(chunk) / len(chunk), 3)
                    for chunk in (losses[i : i + 10] for i in range(0, len(losses), 10))
                ],
                "train_wall_s": round(result.train_wall_s, 1),
                "train_cpu_s": round(train_cpu, 1),
                "wall_s": round(time.perf_counter() - t0, 1),
                "load_avg": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )
    return 0


if __name__ == "__main__":
    # the source tree, in place of this script's folder (whose gguf.py would shadow the gguf package)
    sys.path[0] = str(Path(__file__).resolve().parents[1] / "src")
    raise SystemExit(main())
