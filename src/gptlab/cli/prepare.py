"""``gptlab prepare INPUT... --out DATA_DIR --tokenizer char|bpe:N|gpt2:DIR|FILE|MODEL [--format text|chat|alpaca|preference|prompts]``:
corpora → token shards (instruction data: rows with a loss mask)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


def model_tokenizer(spec: str) -> Tokenizer | None:
    """``--tokenizer MODEL``: the tokenizer of the model ``spec`` names, or None when it names none."""
    from gptlab.sources import model_tokenizer as of_model

    return of_model(spec)


def _text(inputs: list[str], out: str, **kwargs: Any) -> dict[str, Any]:
    from gptlab.data import prepare

    return prepare(inputs, out, **kwargs, model_tokenizer=model_tokenizer)


def _pairs(
    inputs: list[str], out: str, *, workers: int = 1, shard_tokens: int = 0, **kwargs: Any
) -> dict[str, Any]:
    from gptlab.data.pairs import prepare_pairs
    from gptlab.errors import GptlabError

    if shard_tokens:
        raise GptlabError("--shard-tokens applies to --format text; pairs are written as one file per split")
    return prepare_pairs(
        inputs, out, **kwargs, model_tokenizer=model_tokenizer
    )  # pairs datasets are small: one process


def _chat(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from gptlab.data.chat import prepare_chat

    return prepare_chat(*args, **kwargs, model_tokenizer=model_tokenizer)


def _preference(inputs: list[str], out: str, **kwargs: Any) -> dict[str, Any]:
    from gptlab.data.preference import prepare_preference

    return prepare_preference(inputs, out, **kwargs, model_tokenizer=model_tokenizer)


def _alpaca(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from gptlab.data.chat import prepare_alpaca

    return prepare_alpaca(*args, **kwargs, model_tokenizer=model_tokenizer)


def _prompts(inputs: list[str], out: str, **kwargs: Any) -> dict[str, Any]:
    from gptlab.data.prompts import prepare_prompts

    return prepare_prompts(inputs, out, **kwargs, model_tokenizer=model_tokenizer)


#: --format NAME → the function that writes the dataset directory
FORMATS: dict[str, Callable[..., dict[str, Any]]] = {
    "text": _text,
    "pairs": _pairs,
    "chat": _chat,
    "alpaca": _alpaca,
    "preference": _preference,
    "prompts": _prompts,
}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "prepare",
        help="tokenize text files, directories or JSONL into train.bin/val.bin",
        description="Tokenize corpora into a dataset directory: train.bin, val.bin (numpy memmaps), "
        "tokenizer.json and meta.json.",
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="text files, directories (recursive), JSONL with a 'text' field, or parquet with a 'text' column",
    )
    p.add_argument("--out", required=True, help="the dataset directory to write")
    p.add_argument(
        "--format",
        choices=list(FORMATS),
        default="text",
        help="text: a token stream (default); pairs: JSONL of {source, target} for an encoder-decoder; "
        "chat: JSONL of {messages: [{role, content}]}; alpaca: {instruction, input, output}; "
        "preference: {prompt or messages, chosen, rejected} for DPO; "
        "prompts: JSONL of {prompt} or {messages} ending on a user turn (other fields go to the reward)",
    )
    p.add_argument(
        "--tokenizer",
        default="char",
        help="char, bpe:N (train a BPE of N tokens), gpt2:DIR, a saved tokenizer file, or a model whose "
        "tokenizer to use: a checkpoint or run, a Hugging Face folder, a GGUF file, smollm2 (default char)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="share of tokens held out for validation (default 0.1)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=64,
        help="smallest context you will train with; each split must hold one block (default 64)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="tokenizer processes; the output is the same for any N (default 1)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=0,
        metavar="M",
        help="write numbered shards train-00000.bin … of at most M tokens (default 0: one file per split)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (MB/s and ETA)")
    chat = p.add_argument_group("chat, alpaca, preference and prompts data")
    chat.add_argument("--template", default="auto", help="chat template: auto (the model's own) or a name")
    chat.add_argument("--prompt-loss", action="store_true", help="count prompt tokens in the loss too")
    chat.add_argument("--packing", default="packed", choices=["packed", "padded"], help="examples per row")
    chat.add_argument(
        "--too-long", default="truncate", choices=["truncate", "drop"], help="examples over a row"
    )
    chat.add_argument(
        "--skip-bad", action="store_true", help="skip (and count) bad records instead of failing"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = FORMAT_OPTIONS.get(args.format, _no_options)(args)
    meta = FORMATS[args.format](
        args.inputs,
        args.out,
        tokenizer=args.tokenizer,
        val_fraction=args.val_fraction,
        block_size=args.block_size,
        progress=not args.no_progress,
        **options,
    )
    shards = meta.get("shards")
    files = f", {len(shards['train'])} + {len(shards['val'])} shard file(s)" if shards else ""
    print(
        f"{args.out}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens "
        f"({meta['dtype']}, vocabulary {meta['vocab_size']:,}, {meta.get('documents', 0)} document(s){files})"
    )
    if meta.get("kind") == "preference":
        print(
            f"{meta['train_pairs']} train + {meta['val_pairs']} val preference pairs (template {meta['template']}, "
            f"loss on the answers, longest sequence {meta['longest']} tokens); truncated {meta['truncated']}, "
            f"dropped {meta['dropped']}, bad records skipped {meta['skipped_bad']}"
        )
    if meta.get("kind") == "prompts":
        print(
            f"{meta['train_prompts']} train + {meta['val_prompts']} held-out prompts (template {meta['template']}, "
            f"longest {meta['longest_prompt']} tokens); longer than --block-size: dropped {meta['dropped']}, "
            f"bad records skipped {meta['skipped_bad']}"
        )
    if "row_tokens" in meta:
        print(
            f"{meta['examples']} examples in rows of {meta['row_tokens']} tokens ({meta['packing']}, "
            f"template {meta['template']}, loss on {meta['loss_on']} tokens); truncated {meta['truncated']}, "
            f"dropped {meta['dropped']}, bad records skipped {meta['skipped_bad']}"
        )
    return 0


def _no_options(args: argparse.Namespace) -> dict[str, Any]:
    return {}


def _text_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"workers": args.workers, "shard_tokens": args.shard_tokens}


def _chat_options(args: argparse.Namespace) -> dict[str, Any]:
    from gptlab.data import ChatOptions

    return {
        "options": ChatOptions(
            template=args.template,
            prompt_loss=args.prompt_loss,
            packing=args.packing,
            too_long=args.too_long,
            skip_bad=args.skip_bad,
        )
    }


def _prompt_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"template": args.template, "skip_bad": args.skip_bad}


#: --format NAME → the options of that format beyond the common ones
FORMAT_OPTIONS = {
    "text": _text_options,
    "pairs": _text_options,
    "chat": _chat_options,
    "alpaca": _chat_options,
    "preference": _chat_options,
    "prompts": _prompt_options,
}
