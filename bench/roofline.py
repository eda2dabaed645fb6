"""How fast a recipe's training step could be on this CPU at best: a roofline. Prints ONE JSON line.

    python bench/roofline.py [--recipe reference] [--threads 2] [--yardstick-steps 220]

A step of ``B`` sequences of ``T`` tokens costs ``F = 3·(2·N + 2·L·T·d)·B·T`` FLOPs
(``gptlab.inspect.flops``: forward and backward of the matrix products; norms, activations, the
softmax and the optimizer are left out, so ``F`` is a lower bound on the work). No step can take
less than ``F / P`` seconds, where ``P`` is the best rate this CPU multiplies matrices at:

    floor_ms          = F / P                      P: the fastest of square float32 products
    yardstick_gflops  = F / t_yardstick            t: the nanoGPT-style loop's median step here
    max_speedup       = t_yardstick / floor_ms     the most any implementation can gain over it
    share_of_peak_2x  = 2·F / (t_yardstick·P)      what a 2× faster step would have to sustain

``shape_gflops`` is the rate of the recipe's own forward products (``B·T`` rows times each weight
matrix), which is what the step actually multiplies; small products run below ``P``. The same is
measured for bfloat16 (``bf16_*``), whose rate decides whether a CPU can go past the float32 bound.
Medians of ``--repeats`` timings; run it with the machine to itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: bench/ imports as the package `bench`
from bench.baseline_minimal import BATCH, BLOCK, MinimalRun  # noqa: E402
from bench.train_shakespeare_char import DEFAULT_DATA, RECIPES  # noqa: E402


def significant(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant figures: a ratio near 0.09 keeps its precision, which two decimals
    would not (0.0873 printed as 0.09 is 3 % off, and a figure derived from it is off by as much)."""
    return float(f"{x:.{digits}g}")


def median_s(fn: Callable[[], object], repeats: int, budget_s: float = 5.0) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after one warm-up call, fewer (at least 3)
    where the calls would take more than ``budget_s`` in all (emulated bf16 runs ~100× slower)."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    if first * repeats > budget_s:
        repeats = max(min(3, repeats), int(budget_s / first))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def square_gflops(dtype: torch.dtype, sizes: tuple[int, ...], repeats: int) -> float:
    """The best rate over square ``n×n·n×n`` products (``2n³`` FLOPs each), in GFLOP/s."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        best = max(best, 2 * n**3 / median_s(lambda a=a, b=b: a @ b, repeats) / 1e9)
    return best


def shapes_gflops(shapes: list[tuple[int, int, int]], dtype: torch.dtype, repeats: int) -> float:
    """FLOP-weighted rate of the ``(m×k)·(k×n)`` products in ``shapes``, in GFLOP/s."""
    flops, seconds = 0, 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        flops += 2 * m * k * n
        seconds += median_s(lambda a=a, b=b: a @ b, repeats)
    return flops / seconds / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="reference")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument(
        "--yardstick-steps",
        type=int,
        default=220,
        help="yardstick steps; its first 20 are warm-up, so 20 or fewer skip it",
    )
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from gptlab import hardware
    from gptlab.inspect.flops import training_flops_per_token
    from gptlab.train.config import build_config

    cfg = build_config(RECIPES[args.recipe], [])
    model = cfg.model_config(65)  # Tiny Shakespeare's characters
    T, B, d = model.block_size, cfg.batch_size, model.n_embd
    flops = training_flops_per_token(model, T) * B * T
    ff = model.d_ff or 4 * d
    rows = B * T
    shapes = [(rows, d, 3 * d), (rows, d, d), (rows, d, ff), (rows, ff, d), (rows, d, model.vocab_size)]
    load_start = os.getloadavg()[0]
    peak = {dt: square_gflops(dt, tuple(args.sizes), args.repeats) for dt in (torch.float32, torch.bfloat16)}
    shaped = {dt: shapes_gflops(shapes, dt, args.repeats) for dt in (torch.float32, torch.bfloat16)}
    out: dict[str, object] = {
        "bench": "roofline",
        "recipe": args.recipe,
        "batch": B,
        "context": T,
        "train_gflop_per_step": significant(flops / 1e9),
        "peak_gflops": significant(peak[torch.float32]),
        "shape_gflops": significant(shaped[torch.float32]),
        "bf16_peak_gflops": significant(peak[torch.bfloat16]),
        "bf16_shape_gflops": significant(shaped[torch.bfloat16]),
        "floor_ms": significant(1000 * flops / (peak[torch.float32] * 1e9)),
        "bf16_floor_ms": significant(1000 * flops / (peak[torch.bfloat16] * 1e9)),
    }
    if args.yardstick_steps > 20:
        if (B, T) != (BATCH, BLOCK):
            raise SystemExit(f"the yardstick runs {BATCH}×{BLOCK}; recipe {args.recipe} is {B}×{T}")
        run, times = MinimalRun(args.data, args.yardstick_steps), []
        for it in range(args.yardstick_steps):
            t = time.perf_counter()
            run.step(it)
            times.append(time.perf_counter() - t)
        step_s = statistics.median(times[20:])
        out |= {
            "yardstick_ms": significant(1000 * step_s),
            "yardstick_gflops": significant(flops / step_s / 1e9),
            "max_speedup": significant(step_s * peak[torch.float32] * 1e9 / flops),
            "bf16_max_speedup": significant(step_s * peak[torch.bfloat16] * 1e9 / flops),
            "share_of_peak_2x": significant(2 * flops / (step_s * peak[torch.float32] * 1e9)),
        }
    out |= {
        "cpu": hardware.detect().describe_cpu(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "loadavg_at_start": round(load_start, 2),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
