"""The server's decode loop without HTTP: tokens/s of ``Scheduler`` over many concurrent jobs.

    python bench/serve_scheduler.py [--checkpoint DIR] [--jobs 50] [--tokens 48] [--max-batch 16] [--runs 7]

``--jobs`` one-choice requests of ``--tokens`` sampled tokens each (temperature 1, a seed each) go to one
``gptlab.serve.scheduler.Scheduler``; the figure is generated tokens over the wall time from the first
submit to the last end, the median of ``--runs``. Without ``--checkpoint`` the model is a random one of
the ``reference`` recipe's shape (4 layers, 4 heads, 128 wide, a 64-token context, 65 characters).
It isolates the per-token work of serving (admission, sampling, channels) from HTTP, whose timings on a
2-core VM spread too widely to compare two versions (``bench/serve_load.py`` measures the whole server).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch

from gptlab.generate import SampleConfig
from gptlab.serve.scheduler import Channel, EndEvent, Job, Scheduler

TEXT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.;:!?'-\n&$3"  # 65 characters


def model_and_tokenizer(checkpoint: str | None):
    if checkpoint:
        import gptlab

        model, tokenizer = gptlab.load(checkpoint)
        return model.eval(), tokenizer
    from gptlab import GPT, GPTConfig
    from gptlab.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128)
    return GPT(config).eval(), tokenizer


async def one_run(model, tokenizer, jobs: int, tokens: int, max_batch: int) -> float:
    scheduler = Scheduler(model, tokenizer, max_batch=max_batch)
    loop = asyncio.get_running_loop()
    prompt = tokenizer.encode("ROMEO:\n")
    work = [
        Job(prompt, SampleConfig(max_new_tokens=tokens, temperature=1.0, seed=i), Channel(loop), index=0)
        for i in range(jobs)
    ]

    async def end(job: Job) -> None:
        events: list = []
        while not any(isinstance(event, EndEvent) for event in events):
            events = await job.channel.get()

    t0 = time.perf_counter()
    for job in work:
        scheduler.submit(job)
    await asyncio.gather(*(end(job) for job in work))
    seconds = time.perf_counter() - t0
    scheduler.close()
    return jobs * tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint", help="a checkpoint to serve (default: a random reference-sized model)"
    )
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = model_and_tokenizer(args.checkpoint)
    runs = [
        asyncio.run(one_run(model, tokenizer, args.jobs, args.tokens, args.max_batch))
        for _ in range(args.runs)
    ]
    print(
        json.dumps(
            {
                "bench": "serve_scheduler",
                "tokens_per_s": round(statistics.median(runs), 1),
                "runs": [round(r, 1) for r in runs],
                "jobs": args.jobs,
                "tokens": args.tokens,
                "max_batch": args.max_batch,
                "threads": args.threads,
            }
        )
    )


if __name__ == "__main__":
    main()
