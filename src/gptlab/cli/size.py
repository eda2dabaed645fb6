"""``gptlab size --preset gpt2 | --config FILE | MODEL``: parameters, FLOPs, KV cache, training memory."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "size",
        help="parameter counts, FLOPs, KV-cache and training memory, each with its formula",
        description="Size and cost of a model configuration. Give a model, --preset or --config.",
    )
    p.add_argument(
        "model",
        nargs="?",
        help="a checkpoint or run directory, a Hugging Face folder, a GGUF file or smollm2 "
        "(only its configuration is read)",
    )
    p.add_argument("--preset", help="a named configuration, e.g. gpt2, llama-tiny")
    p.add_argument(
        "--config", dest="config_file", help="a JSON file with GPTConfig fields (or a config.json)"
    )
    p.add_argument("--context", type=int, help="tokens T the costs are for (default: the model's block_size)")
    p.add_argument("--source", type=int, help="source tokens S of an encoder–decoder (default: --context)")
    p.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--dtype", default="fp32", help="number format: fp32, bf16, fp16 (default fp32)")
    p.add_argument("--kv-dtype", help="KV-cache storage: fp32, bf16, fp16 or int8 (default: --dtype)")
    p.add_argument(
        "--strategy", choices=("ddp", "fsdp"), help="add per-rank training memory under DDP or FSDP"
    )
    p.add_argument("--world-size", type=int, default=2, help="ranks for --strategy (default 2)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gptlab.inspect.size import load_config, size_report

    config, name = load_config(args.preset, args.config_file, args.model)
    report = size_report(
        config,
        context=args.context,
        batch=args.batch,
        dtype=args.dtype,
        name=name,
        kv_dtype=args.kv_dtype,
        source=args.source,
    )
    if args.strategy:
        from gptlab.inspect.size import DTYPES, dtype_name
        from gptlab.train.strategy import per_rank_memory

        b = DTYPES[dtype_name(args.dtype)][1]
        report.training_memory += per_rank_memory(config, args.strategy, args.world_size, b)
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False, indent=2))
    else:
        sys.stdout.write(report.render())
    return 0
