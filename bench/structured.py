"""Structured output's cost: time per token of JSON-schema-constrained requests against free ones.

    python bench/structured.py [--model demo|smollm2] [--tokens 48] [--runs 3] [--threads 2]

The server's decode loop without HTTP (``gptlab.serve.scheduler.Scheduler``, as
``bench/serve_scheduler.py``): each case submits its requests together and times the wall from the
first submit to the last end, over ``--tokens`` tokens per request (every request runs to that length:
the end-of-text token is banned with ``logit_bias`` in both kinds, and the schema's array needs more
items than fit). Cases, each the median of ``--runs`` (interleaved, so that a busy machine slows them
alike):

    batch 1:  one free request            | one constrained request
    batch 8:  eight free requests         | one constrained + seven free (mixed) | eight constrained

The schema is a realistic record list (objects with a bounded string, a bounded integer and a
boolean). ``--model demo`` is a random model of the demo's shape (4 layers, 4 heads, 128 wide, a
64-token context) over a character vocabulary that can write JSON; ``--model smollm2`` the real
SmolLM2-135M-Instruct GGUF file, with its chat template. The figures are the ratios constrained/free
of the time per token (target ≤ 1.1), of the wall time and of the process's CPU time (all threads;
steadier than the wall on a shared machine), and the grammar engine's own time per token without the
model (``engine_ms_per_token``: a fresh request's mask and advance per token, random allowed tokens,
once the paths were walked before; ``_cold``: the first walk, while the engine builds the lexer states
it meets) over a free request's time per token at batch 1 (``engine_share_b1``): what a constrained
row adds to each step. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import torch

from gptlab.generate import SampleConfig
from gptlab.serve.scheduler import Channel, EndEvent, Job, Scheduler

#: characters of the demo-size model's vocabulary: enough to write any JSON of the schema
DEMO_TEXT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.:;!?'-_\n{}[]\""

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 1000,  # never complete within --tokens: every request runs to its length
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "member": {"type": "boolean"},
                },
                "required": ["name", "age", "member"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["people"],
    "additionalProperties": False,
}


def model_and_prompt(name: str) -> tuple[Any, Any, list[int]]:
    if name == "smollm2":
        from gptlab.sources import load_source
        from gptlab.tokenizers.chat import template_for

        model, tokenizer = load_source("smollm2")
        text = template_for(tokenizer).render(
            [{"role": "user", "content": "List the members of the chess club as JSON."}]
        )
        return model.eval(), tokenizer, tokenizer.encode(text, allowed_special="all")
    from gptlab import GPT, GPTConfig
    from gptlab.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.from_text(DEMO_TEXT, special_tokens=["<|endoftext|>"])
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128)
    return GPT(config).eval(), tokenizer, tokenizer.encode("members:\n")


async def one_run(
    scheduler: Scheduler, prompt: list[int], configs: list[SampleConfig]
) -> tuple[float, float]:
    """Seconds per decode step (wall / tokens per request) for ``configs`` submitted together, and
    the process's CPU seconds per step (every thread: the model's, the scheduler's, the grammar's)."""
    loop = asyncio.get_running_loop()
    jobs = [Job(prompt, c, Channel(loop)) for c in configs]

    async def end(job: Job) -> None:
        while True:
            events = await job.channel.get()
            if any(isinstance(e, EndEvent) for e in events):
                return

    t0, c0 = time.perf_counter(), time.process_time()
    for job in jobs:
        scheduler.submit(job)
    await asyncio.gather(*(end(job) for job in jobs))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    made = {job.generated for job in jobs}
    assert made == {configs[0].max_new_tokens}, f"a request stopped early: {made}"
    return seconds / configs[0].max_new_tokens, cpu / configs[0].max_new_tokens


def engine_ms_per_token(tokenizer: Any, config: SampleConfig, tokens: int, runs: int) -> float:
    """The grammar's own cost per token, without the model: a fresh request's ``Constraint`` driven
    through ``tokens`` steps (each a random allowed token), ``allowed()`` + ``consume()`` timed; median."""
    from gptlab.generate.grammar import Constraint

    out = []
    for run in range(runs):
        generator = torch.Generator().manual_seed(run)
        t0 = time.perf_counter()
        constraint = Constraint(config, tokenizer, tokenizer.vocab_size, [tokenizer.eot_id])
        for _ in range(tokens):
            allowed = torch.nonzero(constraint.allowed()).flatten()
            constraint.consume(int(allowed[torch.randint(len(allowed), (1,), generator=generator)]))
        out.append((time.perf_counter() - t0) / tokens)
    return statistics.median(out) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["demo", "smollm2"], default="demo")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer, prompt = model_and_prompt(args.model)
    eos = tokenizer.eot_id
    free = SampleConfig(
        max_new_tokens=args.tokens,
        temperature=1.0,
        seed=0,
        logit_bias={eos: -100.0} if eos is not None else {},
    )
    json_ = free.replace(json_schema=SCHEMA)
    cases = {
        "b1_free": [free],
        "b1_json": [json_],
        "b8_free": [free.replace(seed=i) for i in range(8)],
        "b8_mixed": [json_] + [free.replace(seed=i) for i in range(1, 8)],
        "b8_json": [json_.replace(seed=i) for i in range(8)],
    }
    scheduler = Scheduler(model, tokenizer, max_batch=8)
    with torch.inference_mode():
        for configs in cases.values():  # warm-up: the grammar engine's table, the kernels
            asyncio.run(one_run(scheduler, prompt, configs))
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, configs in cases.items():
                wall, used = asyncio.run(one_run(scheduler, prompt, configs))
                times[name].append(wall)
                cpu[name].append(used)
    scheduler.close()
    cold_ms = engine_ms_per_token(tokenizer, json_, args.tokens, max(args.runs, 5))  # lexer states built
    engine_ms = engine_ms_per_token(tokenizer, json_, args.tokens, max(args.runs, 5))  # then reused
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    cpu_ms = {name: statistics.median(t) * 1e3 for name, t in cpu.items()}
    print(
        json.dumps(
            {
                "bench": "structured",
                "model": args.model,
                "ms_per_token": {name: round(v, 3) for name, v in ms.items()},
                "ratio_b1": round(ms["b1_json"] / ms["b1_free"], 3),
                "ratio_b8_mixed": round(ms["b8_mixed"] / ms["b8_free"], 3),
                "ratio_b8_all": round(ms["b8_json"] / ms["b8_free"], 3),
                "cpu_ms_per_token": {name: round(v, 3) for name, v in cpu_ms.items()},
                "cpu_ratio_b1": round(cpu_ms["b1_json"] / cpu_ms["b1_free"], 3),
                "cpu_ratio_b8_mixed": round(cpu_ms["b8_mixed"] / cpu_ms["b8_free"], 3),
                "cpu_ratio_b8_all": round(cpu_ms["b8_json"] / cpu_ms["b8_free"], 3),
                "engine_ms_per_token": round(engine_ms, 3),
                "engine_ms_per_token_cold": round(cold_ms, 3),
                "engine_share_b1": round(engine_ms / ms["b1_free"], 4),
                "tokens": args.tokens,
                "runs": args.runs,
                "threads": args.threads,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
