"""``gptlab fill CKPT "The cat [MASK] on the mat"``: a masked-language model's top-k per mask."""

from __future__ import annotations

import argparse
from typing import Any

from gptlab.cli.options import add_model_argument


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fill",
        help="predict the [MASK] tokens of a text with a masked-language model",
        description="Print the top-k predictions for each [MASK] in TEXT, using a bidirectional "
        "encoder trained with objective=mlm.",
    )
    add_model_argument(p)
    p.add_argument("text", metavar="TEXT", help='text with one or more [MASK], e.g. "The cat [MASK] on"')
    p.add_argument("--top-k", type=int, default=5, help="predictions shown per mask (default 5)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import gptlab
    from gptlab.errors import GptlabError
    from gptlab.inspect.fill import fill_masks

    model, tokenizer = gptlab.load(args.checkpoint)
    if tokenizer is None:
        raise GptlabError(f"{args.checkpoint} has no tokenizer.json")
    predictions, filled = fill_masks(model, tokenizer, args.text, args.top_k)
    for n, pred in enumerate(predictions, 1):
        guesses = ", ".join(f"{tok!r} {p:.3f}" for tok, p in pred.top)
        print(f"[MASK] {n} (token {pred.position}): {guesses}")
    print(filled)
    return 0
