"""``gptlab compile MODEL``: compile a model's one-row decode step and its prompt pass into the compile
cache now, and the background compilation that ``sample``, ``chat`` and ``serve`` start under ``--compile
auto``.

gptlab compile smollm2                      # what a later sample, chat or serve of smollm2 loads
gptlab compile ckpt/ --dtype int8 --threads 2

The compiled step is keyed by what its code depends on (torch, the CPU kind, the thread count, the
model's layout, gptlab's source: ``gptlab.generate.one_token``; the prompt pass beside it,
``gptlab.generate.prompt_pass``), so it is compiled with the weight
format and thread count the later command will use. Under ``--compile auto`` a command whose compile
cache lacks the step decodes layer by layer and starts this command once, detached and at the lowest
CPU priority (``gptlab.cli.background``): its output goes to ``compile.log`` in the step's folder, a
``building.json`` there names the process so that no second one starts while it runs, and a
``failed.json`` records a step that cannot be compiled or kept, so that no later command tries again
(delete it to retry). The next command loads the step and decodes compiled from its first token.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from gptlab.cli import startup
from gptlab.cli.background import BUILDING, FAILED
from gptlab.cli.options import (
    add_cache_arguments,
    add_model_argument,
    add_weights_argument,
    cache_dir,
    weights_format,
)
from gptlab.errors import GptlabError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compile",
        help="compile a model's one-row decode step into the compile cache (what later commands load)",
        description="Compile the one-row CPU decode step of a model (checkpoint, run, HF folder, GGUF "
        "file or smollm2) ahead of time into the compile cache, so that sample, chat and serve load it "
        "and decode compiled from their first token. --compile auto starts this in the background "
        "where the cache lacks the step.",
    )
    add_model_argument(p)
    add_weights_argument(p)
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads of the commands that will load it (default: torch's choice)",
    )
    add_cache_arguments(p)
    p.add_argument(
        "--background",
        action="store_true",
        help="run at the lowest CPU priority and record a failure in the step's folder (what --compile auto starts)",
    )
    p.set_defaults(func=run, loads_a_model=True)


def run(args: argparse.Namespace) -> int:
    import torch

    import gptlab
    from gptlab.generate import generate_ids, prepare_decoding
    from gptlab.generate.prompt_pass import applies, keep_prompt_pass
    from gptlab.model.kvcache import default_cache_dtype

    if args.background:
        _lowest_priority()
    if args.threads is not None:
        if args.threads < 1:
            raise GptlabError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    root = cache_dir(args.compile_cache)
    if root is None:
        raise GptlabError("gptlab compile needs a --compile-cache folder to keep the step in")
    store = cache_dir(args.weights_cache)
    weights = weights_format(args.dtype, "cpu", args.checkpoint, 1, store)
    model, _ = gptlab.load(args.checkpoint, device="cpu", quantize=weights, store=store)
    startup.started()
    engine = prepare_decoding(model, compile="on", compile_cache=root, compile_wait=True)
    folder = engine.step_folder()
    if folder is None:
        raise GptlabError(f"{args.checkpoint}: no one-row step to compile for this model")
    what = f"({getattr(model, 'quantization', weights)} weights, {torch.get_num_threads()} threads)"
    if engine.step_kept():
        sys.stderr.write(f"the one-row step of {args.checkpoint} is kept already: {folder}\n")
    else:
        plan = engine.plan(1)
        if plan.step != "fused":
            return _failed(args, folder, f"no compiled one-row step for this model here ({plan.why})")
        started = time.perf_counter()
        generate_ids(model, torch.zeros(1, 1, dtype=torch.long), 2, temperature=0)  # its first step compiles
        ran = engine.ran()
        if not engine.step_kept():
            return _failed(args, folder, f"the step was not kept ({ran})")
        sys.stderr.write(
            f"compiled the one-row step of {args.checkpoint} {what} in {time.perf_counter() - started:.0f} s; "
            f"kept in {folder}\n"
        )
    started = time.perf_counter()
    kept, how = keep_prompt_pass(model, root, default_cache_dtype(model.dtype, model.device))
    if how == "compiled":
        sys.stderr.write(
            f"compiled the prompt pass of {args.checkpoint} {what} in {time.perf_counter() - started:.0f} s; "
            f"kept in {folder}\n"
        )
    elif kept:
        sys.stderr.write(f"the prompt pass of {args.checkpoint} is kept already: {folder}\n")
    elif applies(model):
        return _failed(args, folder, f"the prompt pass was not kept ({how})")
    else:
        sys.stderr.write(how + "\n")
    (folder / BUILDING).unlink(missing_ok=True)
    return 0


def _lowest_priority() -> None:
    """A background compilation yields the cores to whatever the user runs: nice 19, and, where the
    kernel groups a session's processes (Linux's autogroup: this process leads a session of its own,
    which would otherwise get as much CPU as the user's), its group's nice 19 too."""
    if hasattr(os, "nice"):
        os.nice(19)
    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:
        pass  # no autogroup here: nice alone orders the processes


def _failed(args: argparse.Namespace, folder: Path, why: str) -> int:
    """Record a background compilation's failure (no later command tries again), or raise it."""
    if not args.background:
        raise GptlabError(why)
    from gptlab.fileio import atomic_write_json

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / FAILED, {"why": why, "at": time.time()})
    (folder / BUILDING).unlink(missing_ok=True)
    sys.stderr.write(f"error: {why}\n")
    return 2
