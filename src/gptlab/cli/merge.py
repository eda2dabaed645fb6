"""``gptlab merge RUN --out CKPT``: fold a LoRA run's adapters into its base, ``W ← W + (α/r)·B·A``."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "merge",
        help="merge a LoRA run's adapters into its base model as a plain checkpoint",
        description="Read a LoRA run (or one of its checkpoints), load its base model (checked by sha256), "
        "fold the adapters in and write a plain gptlab checkpoint.",
    )
    p.add_argument("run", metavar="RUN", help="LoRA run directory or checkpoint")
    p.add_argument(
        "--out", required=True, metavar="CKPT", help="checkpoint directory to write (new or empty)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gptlab.checkpoint import resolve_checkpoint, save
    from gptlab.checkpoint.lora import is_lora_checkpoint, read_spec
    from gptlab.errors import GptlabError
    from gptlab.sources import load

    source = resolve_checkpoint(args.run)
    if not is_lora_checkpoint(source):
        raise GptlabError(f"{source}: not a LoRA checkpoint (it already holds plain weights)")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GptlabError(f"{out}: already exists and is not an empty directory; choose a new --out")
    spec = read_spec(source)
    model, tokenizer = load(source)
    save(model, tokenizer, out)
    print(
        f"wrote {out}: {source.name} merged into {spec.base['path']} "
        f"(rank {spec.rank}, α {spec.alpha:g}, targets {', '.join(spec.targets)})"
    )
    return 0
