"""The prefix cache: time to first token with a cached 600-token prefix, a chat's prefill, memory under load.

    python bench/prefix_cache.py [--model demo|smollm2|SOURCE] [--prefix 600] [--runs 3] [--requests 200]
                                 [--threads 2] [--kv-keep-s 60] [--parts ttft,chat,memory]

Three figures, through the server's decode loop (``gptlab.serve.scheduler.Scheduler``, no HTTP) and
``gptlab chat``'s reply:

* ``ttft``: the time from submit to the first token of a request of ``--prefix`` random tokens plus a
  10-token question: cold (the cache off; and a miss with it on, which also stores the blocks) and
  warm (the same prefix asked before with another question). Each of ``--runs`` rounds runs the three
  in turn on a fresh prefix (so a shared machine's load falls on all three alike), each sent to an idle
  server (``IDLE_S`` after the previous one ended, as a client's next call comes); ``ratio`` = median
  warm / median cold (target ≤ 0.3), ``ratio_rounds`` the median of each round's warm / cold.
  ``cold_cpu_ms``, ``warm_cpu_ms``, ``ratio_cpu``: the process's CPU time (every thread) from submit to
  the first token, what the wall times come to where no other process competes for the cores. Both
  schedulers are the server's: with ``--kv-keep-s`` (default the server's ``KV_KEEP_S``) a request
  finds the batch's KV cache as the previous one grew it; ``--kv-keep-s 0`` gives it back as soon as
  the server is idle, so every request grows it again (the server's behaviour before the grace period).
* ``chat``: a 5-turn conversation as ``gptlab chat`` runs it (the model's chat template, greedy,
  ``--reply`` tokens a turn, ``stream_events``) with a ~300-token system prompt: the sum over turns of
  the time to the first token (each turn's prefill), with one ``PrefixCache`` for the conversation and
  without, and whether the replies are the same.
* ``memory``: ``--requests`` requests in waves of ``max_batch``, each one of 40 random prefixes of
  100–600 tokens plus a random suffix, under a ``--budget-mb`` budget: the cache's largest size seen
  (never above the budget), its counters, the process's resident memory before and after, and the
  batch's own KV cache at the longest request (``batch_kv_mb``, held while it runs, not the cache's).

``--model demo`` is a random model of the demo's shape (``char-best``: 4 layers, 4 heads, 96 wide,
RoPE) with its context widened to 1,024 tokens so that a 600-token prefix fits (timings do not depend
on the weights); ``smollm2`` (or any source ``gptlab serve`` opens) is loaded as the server loads it.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import time

import torch

from gptlab.generate import SampleConfig
from gptlab.generate.prefix_cache import PrefixCache, budget_of
from gptlab.serve.scheduler import KV_KEEP_S, Channel, EndEvent, Job, Scheduler

TEXT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.;:!?'-\n&$3"
#: seconds between one timed request's end and the next (the server has gone idle: it finishes what a
#: request leaves behind, and with ``--kv-keep-s 0`` gives the grown KV cache back, before the next)
IDLE_S = 0.05


def load(name: str):
    if name == "demo":
        from gptlab import GPT, GPTConfig
        from gptlab.tokenizers import CharTokenizer

        tokenizer = CharTokenizer.from_text(TEXT)
        torch.manual_seed(0)
        config = GPTConfig(
            vocab_size=tokenizer.vocab_size,
            block_size=1024,
            n_layer=4,
            n_head=4,
            n_embd=96,
            d_ff=288,
            pos="rope",
            norm="rmsnorm",
            mlp="relu2",
            bias=False,
            qk_norm=True,
        )
        return GPT(config).eval(), tokenizer
    from gptlab.hardware import inference_weights
    from gptlab.model.weight_formats import quantize
    from gptlab.sources import load_source

    model, tokenizer = load_source(name)  # a GGUF file, a HF folder, a checkpoint
    return quantize(model, inference_weights("cpu", 8)).eval(), tokenizer  # the weights gptlab serve picks


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def first_token_s(
    scheduler: Scheduler, prompts: list[list[int]], tokens: int = 1, cpu: list[float] | None = None
) -> list[float]:
    """Submit ``prompts`` together → each one's seconds from submit to its first token (then to its end);
    ``cpu`` gets the process's CPU seconds (every thread) from submit to each first token."""
    loop = asyncio.get_running_loop()
    config = SampleConfig(max_new_tokens=tokens, temperature=0.0)
    jobs = [Job(p, config, Channel(loop)) for p in prompts]
    c0 = time.process_time()
    t0 = time.perf_counter()
    for job in jobs:
        scheduler.submit(job)

    async def wait(job: Job) -> float:
        first = None
        while True:
            events = await job.channel.get()
            if first is None:
                first = time.perf_counter() - t0
                if cpu is not None:
                    cpu.append(time.process_time() - c0)
            if any(isinstance(e, EndEvent) for e in events):
                return first

    return list(await asyncio.gather(*(wait(job) for job in jobs)))


def random_ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


async def ttft(model, tokenizer, prefix: int, runs: int, vocab: int, keep_s: float) -> dict:
    rng = random.Random(0)
    off = Scheduler(model, tokenizer, max_batch=8, prefix_cache_bytes=0, kv_keep_s=keep_s)
    on = Scheduler(model, tokenizer, max_batch=8, prefix_cache_bytes=budget_of(256), kv_keep_s=keep_s)
    await first_token_s(off, [random_ids(rng, vocab, 32)])  # warm-up: first-call costs
    await first_token_s(on, [random_ids(rng, vocab, 32)])
    cold, miss, warm = [], [], []
    cold_cpu: list[float] = []
    warm_cpu: list[float] = []
    for _ in range(runs):
        shared = random_ids(rng, vocab, prefix)
        for times, scheduler, cpu in ((cold, off, cold_cpu), (miss, on, None), (warm, on, warm_cpu)):
            await asyncio.sleep(IDLE_S)
            times += await first_token_s(scheduler, [shared + random_ids(rng, vocab, 10)], cpu=cpu)
    off.close()
    on.close()
    c, m, w = (statistics.median(x) * 1000 for x in (cold, miss, warm))
    rounds = statistics.median(b / a for a, b in zip(cold, warm, strict=True))
    return {
        "cold_ms": round(c, 1),
        "miss_ms": round(m, 1),
        "warm_ms": round(w, 1),
        "ratio": round(w / c, 3),
        "ratio_rounds": round(rounds, 3),
        "cold_cpu_ms": round(statistics.median(cold_cpu) * 1000, 1),
        "warm_cpu_ms": round(statistics.median(warm_cpu) * 1000, 1),
        "ratio_cpu": round(statistics.median(warm_cpu) / statistics.median(cold_cpu), 3),
        "runs": runs,
        "kv_keep_s": keep_s,
    }


def chat(model, tokenizer, reply_tokens: int) -> dict:
    """Five turns as ``gptlab chat`` runs them (``cli.chat.reply``'s ``stream_events``), timing each
    turn's first token event (its prefill)."""
    from gptlab.generate import stream_events
    from gptlab.tokenizers.chat import stop_ids, template_for

    template = template_for(tokenizer)
    config = SampleConfig(
        max_new_tokens=reply_tokens,
        temperature=0.0,
        stop=list(template.stop_strings),
        stop_tokens=stop_ids(tokenizer),
    )
    rule = "You are a careful assistant. Answer briefly, cite nothing, and stay polite."
    system = rule
    while len(tokenizer.encode(system)) < 300:  # ~300 tokens whatever the tokenizer
        system += " " + rule
    questions = ["What is a cache?", "Why is it fast?", "And when is it slow?", "Give an example.", "Thanks!"]
    out: dict = {}
    replies: dict[str, list[str]] = {}
    for label, cache in (("without_ms", None), ("with_ms", PrefixCache(budget_of(256)))):
        history = [{"role": "system", "content": system}]
        total, turns = 0.0, []
        for q in questions:
            history.append({"role": "user", "content": q})
            prompt = template.render(history)
            t0 = time.perf_counter()
            first, pieces = None, []
            for event in stream_events(
                model, tokenizer, prompt, config, want_probs=False, prefix_cache=cache
            ):
                first = first if first is not None else time.perf_counter() - t0
                pieces.append(event.text)
            total += first or 0.0
            turns.append("".join(pieces).strip())
            history.append({"role": "assistant", "content": turns[-1]})
        out[label] = round(total * 1000, 1)
        replies[label] = turns
        if cache is not None:
            out["reused_tokens"] = cache.tokens_reused
            out["looked_up_tokens"] = cache.tokens_looked_up
    out["same_replies"] = replies["with_ms"] == replies["without_ms"]
    out["ratio"] = round(out["with_ms"] / out["without_ms"], 3)
    return out


async def memory(model, tokenizer, requests: int, budget_mb: float, vocab: int) -> dict:
    rng = random.Random(1)
    pool = [random_ids(rng, vocab, rng.randrange(100, 600)) for _ in range(40)]
    scheduler = Scheduler(model, tokenizer, max_batch=8, prefix_cache_bytes=budget_of(budget_mb))
    await first_token_s(scheduler, [random_ids(rng, vocab, 32)])
    before = rss_mb()
    peak = 0
    t0 = time.perf_counter()
    for start in range(0, requests, 8):
        wave = [
            rng.choice(pool) + random_ids(rng, vocab, rng.randrange(1, 20))
            for _ in range(min(8, requests - start))
        ]
        await first_token_s(scheduler, wave, tokens=4)
        peak = max(peak, scheduler.prefix_cache.bytes)
    stats = scheduler.prefix_cache.stats()
    seconds = time.perf_counter() - t0
    # the batch's own KV cache at the longest request's length (it grows to it, then shrinks when idle)
    rows = scheduler.session.dynamic
    per_position = sum(
        t.element_size() * t.size(0) * t.size(1) * t.size(3) for s in rows.stores for t in s.tensors()
    )
    longest = 1 << (max(map(len, pool)) + 20 - 1).bit_length()
    scheduler.close()
    return {
        "budget_mb": budget_mb,
        "peak_cache_mb": round(peak / 2**20, 2),
        "within_budget": peak <= stats["budget_bytes"],
        "rss_before_mb": round(before, 1),
        "rss_after_mb": round(rss_mb(), 1),
        "batch_kv_mb": round(per_position * min(longest, rows.max_len) / 2**20, 1),
        "hits": stats["hits"],
        "misses": stats["misses"],
        "evictions": stats["evictions"],
        "reused_share": round(stats["tokens_reused"] / max(1, stats["tokens_looked_up"]), 3),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="demo", help="demo (a random model of the demo's shape), smollm2, or a source"
    )
    parser.add_argument("--prefix", type=int, default=600)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reply", type=int, default=24, help="tokens per chat reply")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--budget-mb", type=float, default=16, help="the memory part's budget (below its working set)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kv-keep-s",
        type=float,
        default=KV_KEEP_S,
        help="seconds the idle server keeps its grown KV cache (0: shrinks at once)",
    )
    parser.add_argument("--parts", default="ttft,chat,memory", help="which figures, comma-separated")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    vocab = min(tokenizer.vocab_size, model.config.vocab_size)
    with torch.inference_mode():
        result: dict = {"bench": "prefix_cache", "model": args.model, "threads": args.threads}
        if "ttft" in parts:
            result["ttft"] = asyncio.run(
                ttft(model, tokenizer, args.prefix, args.runs, vocab, args.kv_keep_s)
            )
        if "chat" in parts:
            result["chat"] = chat(model, tokenizer, args.reply)
        if "memory" in parts:
            result["memory"] = asyncio.run(memory(model, tokenizer, args.requests, args.budget_mb, vocab))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
