"""``gptlab train --data DATA_DIR --out RUN_DIR [--config FILE.toml|RECIPE] [key=value ...] [--resume]``."""

from __future__ import annotations

import argparse
import os
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a GPT on a prepared dataset",
        description="Train a GPT. Settings come from --config (a TOML file or a built-in recipe; without it "
        "char-best, gptlab's best small recipe), then key=value overrides (max_steps=500 model.n_layer=6 "
        "lr=3e-3). --resume continues a run with its saved settings and prints those that the overrides "
        "change. Under torchrun it trains with DDP.",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="settings, e.g. max_steps=500 model.pos=rope"
    )
    p.add_argument("--data", help="dataset directory made by `gptlab prepare` (optional with --resume)")
    p.add_argument("--out", required=True, help="run directory for checkpoints, metrics.jsonl and loss.png")
    p.add_argument("--config", help="TOML file or built-in recipe name (default: char-best)")
    p.add_argument(
        "--init",
        metavar="SRC",
        help="start from pretrained weights, as init=SRC (a checkpoint, run, "
        "Hugging Face folder, GGUF file, or smollm2: the packaged GGUF file)",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gptlab.checkpoint import read_run_config
    from gptlab.train import resolve_run, train
    from gptlab.train.config import config_changes, finished
    from gptlab.train.precision import AUTO_FIELDS

    overrides = [*args.overrides, *([f"init={args.init}"] if args.init else [])]
    cfg, data = resolve_run(args.out, args.data, args.resume, args.config, overrides)
    done = finished(args.out, cfg) if args.resume else None
    if done is not None:  # resuming a finished run (a requeue) is a no-op, said once under torchrun
        if os.environ.get("RANK", "0") == "0":
            print(done)
        return 0
    if args.resume:
        record = read_run_config(args.out) or {}
        saved = record.get("train")
        if saved:  # a setting left at auto compares as what the first run resolved it to
            resolved = record.get("resolved") or {}
            saved = {
                k: resolved.get(k, v) if v == "auto" and k in AUTO_FIELDS else v for k, v in saved.items()
            }
        changes = config_changes(saved, cfg.to_dict()) if saved else []
        print(
            f"resuming {args.out}" + (f"; changed: {', '.join(changes)}" if changes else " with its settings")
        )
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
