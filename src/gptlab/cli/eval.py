"""``gptlab eval CKPT --text FILE | --data DATA_DIR``: loss, perplexity and bits per byte;
``gptlab eval CKPT --tasks NAMES``: lm-evaluation-harness tasks (``gptlab.evaluate``)."""

from __future__ import annotations

import argparse
import json

from gptlab.cli.options import add_device_argument, add_model_argument, device_from_args, resolve_dtype


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="loss, perplexity and bits per byte of a model on a text or a dataset",
        description="Evaluate a model (a checkpoint, a run directory's latest checkpoint, a Hugging Face "
        "folder, a GGUF file or smollm2) on a text file or on a "
        "prepared dataset's split.",
    )
    add_model_argument(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="a UTF-8 text file, tokenized with the model's tokenizer")
    src.add_argument("--data", help="a dataset directory made by `gptlab prepare`")
    src.add_argument(
        "--tasks",
        help="lm-evaluation-harness tasks, comma-separated (gptlab's own in evals/: gptlab_choice, "
        "gptlab_rolling, gptlab_gen); needs `pip install 'gptlab[eval]'`",
    )
    add_task_arguments(p)
    p.add_argument("--split", default="val", choices=["train", "val"], help="dataset split (default val)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per batch (default 16)")
    p.add_argument(
        "--max-batches", type=int, default=None, help="evaluate at most this many batches (default all)"
    )
    p.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="windows of N tokens (default: the context the model loads at, the same for a base model, "
        "its fine-tuning or LoRA runs and their merges: the base's; printed with the result)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="autocast dtype (default auto: bfloat16 where bf16 is native, else float32)",
    )
    add_device_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it goes to stderr)")
    p.set_defaults(func=run)


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``--tasks`` (lm-eval's, spelled with dashes)."""
    p.add_argument(
        "--include-path", action="append", default=[], metavar="DIR", help="more task YAMLs (repeatable)"
    )
    p.add_argument("--num-fewshot", type=int, default=None, metavar="K", help="few-shot examples per prompt")
    p.add_argument("--limit", type=float, default=None, metavar="N", help="at most N documents per task")
    p.add_argument(
        "--apply-chat-template", action="store_true", help="prompt through the model's chat template"
    )


def run_tasks(args: argparse.Namespace, device: str) -> int:
    from gptlab.evaluate.tasks import TaskRun, require_lm_eval, run_tasks, table

    require_lm_eval()
    run = TaskRun(
        tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        apply_chat_template=args.apply_chat_template,
        batch_size=args.batch_size,
    )
    weights = {"auto": "auto", "float32": "fp32", "bfloat16": "bf16"}[args.dtype]
    results = run_tasks(args.checkpoint, run, dtype=weights, device=device)
    print(json.dumps(results["results"], default=str) if args.json else table(results))
    return 0


def run(args: argparse.Namespace) -> int:
    from gptlab.evaluate.text import evaluate_path
    from gptlab.train.objective_eval import evaluate_objective

    device = device_from_args(args)
    if args.tasks:
        return run_tasks(args, device)

    dtype = resolve_dtype(args.dtype, device, "bfloat16", "float32")
    result, source = evaluate_path(
        args.checkpoint,
        text=args.text,
        data=args.data,
        split=args.split,
        batch_size=args.batch_size,
        max_batches=args.max_batches,
        dtype=dtype,
        device=device,
        progress=not args.no_progress,
        context=args.context,
        objective=evaluate_objective,  # an encoder or an encoder–decoder: its training objective
    )
    if args.json:
        print(json.dumps({"source": source, **result.to_dict(), "context": result.context, "dtype": dtype}))
    else:
        window = f"context {result.context}" if result.context else "rows at their own length"
        print(
            f"{source}: loss {result.loss:.4f} nats/token, perplexity {result.perplexity:.3f}, "
            f"{result.bits_per_byte:.4f} bits/byte over {result.tokens:,} tokens ({window}, dtype {dtype})"
        )
    return 0
