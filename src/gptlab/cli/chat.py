"""``gptlab chat MODEL`` (``gptlab chat smollm2``): an interactive terminal chat with the model's own chat template.

Each line you type is a user message; the reply streams as it is generated and joins the history,
which is rendered with the template again for the next turn. ``/reset`` forgets the history,
``/exit`` (or end of input) quits. Input may come from a pipe: ``printf 'Hi\\n/exit\\n' | gptlab chat CKPT``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from gptlab.cli.options import (
    add_compile_argument,
    add_device_argument,
    add_model_argument,
    add_weights_argument,
    device_from_args,
    prepare_decode,
    weights_format,
)
from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gptlab.generate import SampleConfig
    from gptlab.generate.decoder import Decoder
    from gptlab.tokenizers.base import Tokenizer
    from gptlab.tokenizers.chat import ChatTemplate

COMMANDS = {"/reset": "forget the conversation", "/exit": "quit"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal (its chat template, streamed replies, history)",
        description="Chat with a model (checkpoint, run, Hugging Face folder, GGUF file, smollm2): the prompt is built with the model's own chat template "
        "(or --template), replies stream and stop at the end-of-turn token. /reset forgets the "
        "history, /exit quits.",
    )
    add_model_argument(p)
    p.add_argument("--system", help="a system message that starts every conversation")
    p.add_argument(
        "--template", help="chatml, llama3, plain, or a file with a Jinja template (default: the model's)"
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    add_weights_argument(p)
    add_device_argument(p)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    add_compile_argument(p)
    p.set_defaults(func=run)


def _template(tokenizer: Tokenizer, spec: str | None) -> ChatTemplate:
    from pathlib import Path

    from gptlab.tokenizers.chat import FALLBACKS, template_for

    if spec is None or spec in FALLBACKS:
        return template_for(tokenizer, spec)
    path = Path(spec)
    if not path.is_file():
        raise GptlabError(f"--template {spec!r} is neither {', '.join(FALLBACKS)} nor a template file")
    return template_for(tokenizer, path.read_text(encoding="utf-8"))


def reply(
    model: Decoder,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    messages: list[dict[str, str]],
    config: SampleConfig,
) -> Iterator[str]:
    """Stream the assistant's reply to ``messages``: yields text pieces, stops at an end-of-turn token."""
    from gptlab.generate import stream_events

    prompt = template.render(messages)
    for event in stream_events(model, tokenizer, prompt, config, want_probs=False):
        if event.text:
            yield event.text


def run(args: argparse.Namespace) -> int:
    import torch

    import gptlab
    from gptlab.generate import SampleConfig
    from gptlab.tokenizers.chat import stop_ids

    if args.threads is not None:
        torch.set_num_threads(max(1, args.threads))
    device = device_from_args(args)
    weights = weights_format(args.dtype, device, args.checkpoint)
    model, tokenizer = gptlab.load(args.checkpoint, device=device, quantize=weights)  # converted while read
    if tokenizer is None:
        raise GptlabError(f"{args.checkpoint} has no tokenizer.json; chat needs the model's tokenizer")
    template = _template(tokenizer, args.template)
    # a session's length is unknown: auto judges by one reply, so a short chat is not kept waiting
    # for a compilation (~40 s for SmolLM2) that pays back only after ~1,000 tokens
    prepare_decode(args.compile, model, planned_tokens=args.max_new_tokens)
    config = SampleConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        stop=list(template.stop_strings),
        stop_tokens=stop_ids(tokenizer),
    )
    start = [{"role": "system", "content": args.system}] if args.system else []
    history = list(start)
    interactive = sys.stdin.isatty()
    if interactive:
        sys.stderr.write(f"chat with {args.checkpoint} ({template.name} template); /reset, /exit\n")
    while True:
        if interactive:
            sys.stderr.write("you> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            break
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            history = list(start)
            print("(history cleared)", flush=True)
            continue
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        pieces = []
        for piece in reply(model, tokenizer, template, history, config):
            pieces.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        history.append({"role": "assistant", "content": "".join(pieces).strip()})
    return 0
