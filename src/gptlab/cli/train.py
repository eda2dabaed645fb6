"""``gptlab train --data DATA_DIR --out RUN_DIR [--config FILE.toml|RECIPE] [key=value ...] [--resume]``."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a GPT on a prepared dataset",
        description="Train a GPT. Settings come from TrainConfig defaults, then --config (a TOML file or a "
        "built-in recipe such as shakespeare-char), then key=value overrides (model.n_layer=6 lr=3e-3). "
        "Under torchrun it trains with DDP.",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="settings, e.g. max_steps=500 model.pos=rope"
    )
    p.add_argument("--data", help="dataset directory made by `gptlab prepare` (optional with --resume)")
    p.add_argument("--out", required=True, help="run directory for checkpoints, metrics.jsonl and loss.png")
    p.add_argument("--config", help="TOML file or built-in recipe name")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gptlab.train import resolve_run, train

    cfg, data = resolve_run(args.out, args.data, args.resume, args.config, args.overrides)
    result = train(cfg, data, args.out, resume=args.resume)
    if result.interrupted:
        sys.stderr.write(
            f"interrupted at step {result.step}: saved {result.checkpoint}; "
            f"continue with: gptlab train --out {args.out} --resume\n"
        )
        return 130
    if result.checkpoint is not None:
        val = f", val loss {result.val_loss:.4f}" if result.val_loss is not None else ""
        print(
            f"done: step {result.step}{val}, {result.tokens_per_s:,.0f} tokens/s; checkpoint {result.checkpoint}"
        )
    return 0
