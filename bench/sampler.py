"""What choosing one token costs: ``Sampler`` on one row of logits, per option and vocabulary size. One JSON line.

    python bench/sampler.py                       # vocabularies of 65, 49,152 (SmolLM2) and 50,257 (GPT-2)
    python bench/sampler.py --evict-mb 0          # with the caches left warm between calls
    python bench/sampler.py --decode smollm2 --compile-cache DIR   # and whole decodes, per option

A decode step calls the request's ``Sampler`` once per token (``gptlab.generate.sampling``): greedy is
an argmax; any temperature draws ``argmax_i(z_i − log(−log u_i))`` with ``u`` hashed from (seed,
position, token), over the tokens near the row's top where that settles it (``Sampler.near_top``), else
~20 passes over the vocabulary. Between two calls a real step streams the model's
weights through the caches, so by default each call here follows a pass over ``--evict-mb`` MB (not
timed), as it does in decoding. Per option and vocabulary: the median microseconds of ``--calls``
calls, in ``--rounds`` rounds (options in turns), on ``--threads`` threads.

With ``--decode SRC``: the model's steady decode, tokens per second per option (64 tokens after a
6-token prompt, less a 1-token run: the median of ``--rounds``), as ``prepare_decoding(model,
compile="auto", compile_cache=…)`` runs it (``gptlab compile SRC --compile-cache DIR`` keeps its step
first), and the microseconds a token spends outside the compiled step (``us_outside_the_step``: the
sampler, the session's bookkeeping, the driver).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: name → SampleConfig options
OPTIONS = {
    "greedy": {"temperature": 0.0},
    "temperature": {"temperature": 1.0},
    "cool": {"temperature": 0.7},
    "top_p": {"temperature": 0.7, "top_p": 0.9},
    "top_k": {"temperature": 0.8, "top_k": 40},
    "llama_cli": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},  # llama-cli's defaults
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", default="65,49152,50257", help="comma-separated vocabulary sizes")
    p.add_argument("--options", default=",".join(OPTIONS), help="comma-separated, of: " + ", ".join(OPTIONS))
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--evict-mb", type=int, default=64, help="MB read between calls (0: none)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode", metavar="SRC", help="also time whole decodes of this model, per option")
    p.add_argument("--compile-cache", help="where the model's compiled step is kept (with --decode)")
    args = p.parse_args(argv)

    from gptlab import hardware
    from gptlab.generate import SampleConfig, Sampler

    torch.set_num_threads(args.threads)
    hardware.keep_heap()  # the allocator as decoding sets it
    evict = torch.ones(args.evict_mb * 2**18) if args.evict_mb else None
    history = list(range(100))
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for v in (int(x) for x in args.vocab.split(",")):
            # σ = 6: about 5 % of the tokens within 14 of the top, as SmolLM2's next-token logits
            logits = torch.randn(v, generator=torch.Generator().manual_seed(v)) * 6
            for name in args.options.split(","):
                sampler = Sampler(SampleConfig(seed=1, **OPTIONS[name]), v)  # type: ignore[arg-type]
                sampler(logits, history)
                for _ in range(args.calls):
                    if evict is not None:
                        float(evict.sum())
                    t = time.perf_counter()
                    sampler(logits, history)
                    times.setdefault(f"{name}@{v}", []).append(time.perf_counter() - t)
    us = {k: round(statistics.median(ts) * 1e6, 1) for k, ts in times.items()}
    out: dict[str, object] = {"us_per_token": us, "threads": args.threads, "evict_mb": args.evict_mb}
    if args.decode:
        out["decode_tokens_per_s"], out["us_outside_the_step"] = decode_speeds(
            args.decode, args.options.split(","), args.rounds, args.compile_cache
        )
    print(json.dumps(out))
    return 0


def decode_speeds(
    source: str, options: list[str], rounds: int, cache: str | None
) -> tuple[dict[str, float], dict[str, float]]:
    """Steady tokens per second of ``source`` per sampling option (64 tokens less 1, median of ``rounds``),
    and the microseconds a token spends outside the compiled one-row step (choosing the token, the
    session's bookkeeping), the median of ``rounds`` means."""
    import gptlab
    from gptlab.compiling import Compiled
    from gptlab.generate import generate_ids, prepare_decoding

    model, _ = gptlab.load(source)
    prepare_decoding(model, compile="auto", compile_cache=cache)
    inside: list[float] = []
    call = Compiled.__call__

    def timed(self: Compiled, *args: object) -> object:  # the step's own time, per call
        t = time.perf_counter()
        out = call(self, *args)
        inside.append(time.perf_counter() - t)
        return out

    Compiled.__call__ = timed  # type: ignore[method-assign]
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    speeds: dict[str, list[float]] = {}
    outside: dict[str, list[float]] = {}
    for name in options:
        generate_ids(model, ids, 16, seed=1, **OPTIONS[name])  # type: ignore[arg-type]
    for _ in range(rounds):
        for name in options:
            inside.clear()
            t0 = time.perf_counter()
            generate_ids(model, ids, 65, seed=1, **OPTIONS[name])  # type: ignore[arg-type]
            t1 = time.perf_counter()
            stepped = sum(inside)
            generate_ids(model, ids, 1, seed=1, **OPTIONS[name])  # type: ignore[arg-type]
            loop = (t1 - t0) - (time.perf_counter() - t1)  # 64 tokens after the first
            speeds.setdefault(name, []).append(64 / loop)
            outside.setdefault(name, []).append((loop - stepped) / 64 * 1e6)
    Compiled.__call__ = call  # type: ignore[method-assign]
    median = lambda d: {k: round(statistics.median(v), 1) for k, v in d.items()}  # noqa: E731
    return median(speeds), median(outside)


if __name__ == "__main__":
    raise SystemExit(main())
