"""``gptlab trace CKPT "The cat sat on"``: the pipeline, stage by stage (argument parsing only)."""

from __future__ import annotations

import argparse
import json
import sys

from gptlab.cli.options import add_device_argument, add_model_argument, device_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "trace",
        help="show one input going through the model, stage by stage",
        description="Tokens, embeddings, positions, each block's residual norm and attention, the final state, "
        "the logits and the top next tokens after temperature.",
    )
    add_model_argument(p)
    p.add_argument("text", nargs="?", help="the input text")
    p.add_argument("--ids", help='token ids instead of text, e.g. "464 2415 3332 319"')
    p.add_argument("--temperature", type=float, default=1.0, help="τ in softmax(z/τ); 0 = greedy (default 1)")
    p.add_argument("--top", type=int, default=10, help="how many next tokens to list (default 10)")
    p.add_argument("--json", action="store_true", help="print the trace as JSON")
    p.add_argument("--target", help="encoder-decoder: the target so far (the text is the source)")
    add_device_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gptlab.inspect.inputs import cli_input, load_checkpoint
    from gptlab.inspect.tracing import trace

    text = cli_input(args.text, args.ids)
    model, tokenizer = load_checkpoint(args.checkpoint, device_from_args(args))
    result = trace(model, tokenizer, text, temperature=args.temperature, top=args.top, target=args.target)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=2))
    else:
        sys.stdout.write(result.render())
    return 0
