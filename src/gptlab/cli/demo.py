"""``gptlab demo [--data FILE] [--max-steps N] [--out DIR]``: prepare, train, sample — offline, in minutes."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="train a small character-level GPT offline and print a sample",
        description="Prepare a character-level dataset (default: Python's own documentation text, shipped with "
        "Python), train the char-best recipe with a progress bar, then print a sample and the "
        "path of the loss plot.",
    )
    p.add_argument("--data", help="a UTF-8 text file to train on instead of the built-in corpus")
    p.add_argument("--max-steps", type=int, help="training steps (default: the recipe's)")
    p.add_argument(
        "--out", default="runs/demo", help="demo directory (default runs/demo; its previous run is replaced)"
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="extra train settings, e.g. dtype=float32"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gptlab.demo import run_demo

    run_demo(args.out, data=args.data, max_steps=args.max_steps, overrides=args.overrides)
    return 0
