"""``gptlab sample MODEL``: stream text from any model (argument parsing only).

gptlab sample smollm2 --prompt "The capital of France is" --max-new-tokens 8   # a GGUF file, as it ships
gptlab sample runs/shakespeare --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --top-k 40
gptlab sample ckpt/ --prompt-file prompt.txt --beam-width 4 --dtype int8 --num-samples 3 --seed 1
gptlab sample smollm2 --prompt "A user record: " --json-schema user.schema.json   (or --regex, --grammar)
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from gptlab.cli import startup
from gptlab.cli.background import Later
from gptlab.cli.options import (
    add_compile_argument,
    add_device_argument,
    add_model_argument,
    add_structure_arguments,
    add_weights_argument,
    cache_dir,
    device_from_args,
    prepare_decode,
    print_plan,
    structure_from_args,
    weights_format,
)
from gptlab.errors import GptlabError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sample",
        help="generate text from a model (checkpoint, run, HF folder, GGUF file), streamed to the terminal",
        description="Generate text from a model: a checkpoint (or the latest checkpoint of a run "
        "directory), a Hugging Face folder, a GGUF file or smollm2, streaming tokens as they are produced.",
    )
    add_model_argument(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="", help="the text to continue (default: start from <|endoftext|>)")
    src.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    p.add_argument("--tokenizer", help="a tokenizer file, if the checkpoint has none")
    p.add_argument("--num-samples", type=int, default=1, help="how many samples (seed+i for sample i)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--beam-width", type=int, default=1, help="> 1: beam search instead of sampling")
    p.add_argument("--length-penalty", type=float, default=1.0, help="beam score = log p / length^this")
    p.add_argument(
        "--no-early-stopping",
        dest="early_stopping",
        action="store_false",
        help="beam search: continue while a live beam can still win",
    )
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="a stop string (repeatable)")
    p.add_argument(
        "--stop-token", action="append", type=int, default=[], metavar="ID", help="a stop token id"
    )
    p.add_argument("--seed", type=int)
    add_structure_arguments(p)
    p.add_argument(
        "--prompt-lookup",
        choices=["auto", "on", "off"],
        default="auto",
        help="draft tokens from the text so far and verify them in one pass: the same output in fewer "
        "passes where it copies its input (auto: one sample at a time; default auto)",
    )
    add_weights_argument(p)
    add_device_argument(p)
    p.add_argument(
        "--cache-dtype",
        choices=["model", "fp32", "bf16", "int8"],
        default="model",
        help="KV cache storage (model: the model's dtype; float32 on a CPU for bf16/int8 weights)",
    )
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    add_compile_argument(p)
    p.add_argument(
        "--verbose", action="store_true", help="print the decode plan (engine, step, sampler, why)"
    )
    p.set_defaults(func=run, loads_a_model=True)  # the collector paused until then: cli/startup.py


def _prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is None:
        return args.prompt
    path = Path(args.prompt_file)
    if path.is_dir():
        raise GptlabError(f"{path} is a directory; --prompt-file takes a UTF-8 text file")
    if not path.is_file():
        raise GptlabError(f"{path}: prompt file not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise GptlabError(f"{path}: not UTF-8 text (invalid byte at offset {exc.start})") from None


class _Lines:
    """Warnings as one line each on stderr; a context notice (the window slides) once per run."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(
        self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        from gptlab.generate import ContextWarning

        text = str(message)
        if issubclass(category, ContextWarning):
            if text in self.seen:
                return
            self.seen.add(text)
            sys.stderr.write(f"\nnote: {text}\n")
            return
        sys.stderr.write(f"\nwarning: {text}\n")


def run(args: argparse.Namespace) -> int:
    import torch

    import gptlab
    from gptlab.generate import SampleConfig, stream_events
    from gptlab.generate.driver import check_generative, read_prompt, route
    from gptlab.generate.grammar import check_constraint

    if args.num_samples < 1:
        raise GptlabError(f"--num-samples must be at least 1, got {args.num_samples}")
    if args.threads is not None:
        if args.threads < 1:
            raise GptlabError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    config = SampleConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        beam_width=args.beam_width,
        length_penalty=args.length_penalty,
        early_stopping=args.early_stopping,
        stop=args.stop,
        stop_tokens=args.stop_token,
        seed=args.seed,
        **structure_from_args(args),
        prompt_lookup=args.prompt_lookup,
    )
    prompt = _prompt(args)
    device = device_from_args(args)
    store = cache_dir(args.weights_cache)
    weights = weights_format(args.dtype, device, args.checkpoint, args.num_samples * args.beam_width, store)
    model, tokenizer = gptlab.load(  # converted while read (a GGUF file: once, into --weights-cache)
        args.checkpoint, device=device, quantize=weights, store=store
    )
    startup.started()
    if args.tokenizer:
        from gptlab.checkpoint import check_tokenizer_fits
        from gptlab.tokenizers import load as load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
        check_tokenizer_fits(tokenizer, model.config.vocab_size, args.tokenizer)
    if tokenizer is None:
        raise GptlabError(f"{args.checkpoint} has no tokenizer.json; pass --tokenizer PATH")
    check_generative(model, str(args.checkpoint))  # a masked-language model cannot generate
    decoder, _ = read_prompt(model, tokenizer, prompt)  # fail before printing anything
    check_constraint(config, tokenizer)  # a schema or grammar the engine cannot compile: one error line
    # an encoder-decoder: the prompt is the source (not echoed), the output its target
    echo = prompt if decoder is model else ""
    how = route(model, config)  # the plan's route: the batched rows, beam search or a bound source
    not_for = {"beam": "beam search", "source": "an encoder-decoder"}.get(how)
    one_row = args.num_samples == 1 and args.background_compile == "auto"
    engine = prepare_decode(
        args.compile,
        model,
        args.num_samples * args.max_new_tokens,
        not_for,
        static=args.static,
        compile_cache=args.compile_cache,
        later=Later(args.checkpoint, weights, store) if one_row else None,
    )
    if args.verbose:
        print_plan(engine, args.beam_width, config)
    cache_dtype = {"model": None, "fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[
        args.cache_dtype
    ]
    out = sys.stdout
    n_tokens, seconds = 0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # a library's deprecation notice (torch's lazily imported modules raise some mid-generation)
        # is not the user's business; gptlab's own warnings (the context window) still show
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.showwarning = _Lines()
        for i in range(args.num_samples):
            if i:
                out.write("\n" + "-" * 40 + "\n")
            seed = None if config.seed is None else config.seed + i
            out.write(echo)
            out.flush()
            started = time.perf_counter()
            for event in stream_events(
                model, tokenizer, prompt, config.replace(seed=seed), cache_dtype=cache_dtype, want_probs=False
            ):
                n_tokens += event.token_id is not None
                if event.text:
                    out.write(event.text)
                    out.flush()
            seconds += time.perf_counter() - started
    out.write("\n")
    out.flush()
    rate = n_tokens / seconds if seconds > 0 else 0.0
    sys.stderr.write(
        f"{n_tokens} tokens in {seconds:.2f} s: {rate:.1f} tokens/s ({getattr(model, 'quantization', weights)} weights)\n"
    )
    ran = engine.ran()  # which one-row step decoded how many tokens (eager while it compiled)
    for line in (ran, engine.prompts_ran()):
        if line:
            sys.stderr.write(line + "\n")
    return 0
