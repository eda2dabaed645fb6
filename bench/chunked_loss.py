"""The output head + cross-entropy, plain against chunked (``loss_impl``), at GPT-2's vocabulary.

Rows ``N = B·T`` (default 8,192) of a d_model = 768 hidden state, the head padded to 50,304 rows
(vocabulary 50,257, ``vocab_multiple = 64``), float32 on the CPU: one forward + backward of
``loss(h, W)`` with gradients for ``h`` and ``W``. Each path runs in a fresh process with a fixed
malloc mmap threshold (freed tensors leave the resident set at once). After one warm-up, each of
``--reps`` timed runs gives: ``ms`` (wall) and ``cpu_ms`` (the process's CPU time over its
threads: less disturbed by a busy machine), the fastest of them; ``peak_mb`` (the highest
resident-memory growth during a forward + backward, above the inputs and their gradients) and
``saved_mb`` (the tensors autograd keeps for the backward). Prints one JSON line.

    PYTHONPATH=src python bench/chunked_loss.py [--rows 8192] [--reps 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: bench/ imports as the package `bench`
from bench.activation_memory import PeakRSS, in_fresh_processes  # noqa: E402  (resident memory, fresh processes)

D_MODEL, VOCAB, PADDED = 768, 50257, 50304


def _loss_fn(impl: str):
    import torch

    from gptlab.model.chunked_loss import chunked_cross_entropy
    from gptlab.model.loss import next_token_loss

    def plain(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return next_token_loss(h @ w.t(), y, VOCAB)

    def chunked(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return chunked_cross_entropy(h, w, y, VOCAB)

    return {"plain": plain, "chunked": chunked}[impl]


def _measure(impl: str, rows: int, reps: int) -> dict:
    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    torch.manual_seed(0)
    fn = _loss_fn(impl)
    h = torch.randn(rows, D_MODEL, requires_grad=True)
    w = (torch.randn(PADDED, D_MODEL) * 0.02).requires_grad_()
    y = torch.randint(0, VOCAB, (rows,))

    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    def step() -> float:
        h.grad = w.grad = None
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = fn(h, w, y)
        loss.backward()
        return float(loss)

    loss = step()  # warm-up: the gradients' memory exists from now on
    wall, cpu, peaks = [], [], []
    for _ in range(reps):
        saved = 0
        with PeakRSS() as rss:
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        peaks.append(rss.peak)
    return {
        "ms": round(1000 * min(wall), 1),
        "cpu_ms": round(1000 * min(cpu), 1),
        "peak_mb": round(max(peaks) / 2**20, 1),
        "saved_mb": round(saved / 2**20, 1),
        "loss": round(loss, 6),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192, help="B·T, the rows of the loss")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--impl")
    args = ap.parse_args()
    if args.impl:
        print(json.dumps(_measure(args.impl, args.rows, args.reps)))
        return
    args_ = ("--rows", str(args.rows), "--reps", str(args.reps))
    out = in_fresh_processes(__file__, "--impl", ("plain", "chunked"), *args_)
    print(
        json.dumps(
            {
                "bench": "chunked_loss",
                "rows": args.rows,
                "d_model": D_MODEL,
                "vocab": VOCAB,
                "padded_vocab": PADDED,
                "dtype": "float32",
                **out,
                "peak_ratio": round(out["plain"]["peak_mb"] / max(out["chunked"]["peak_mb"], 0.1), 2),
                "speed_ratio": round(out["plain"]["ms"] / out["chunked"]["ms"], 2),
                "cpu_ratio": round(out["plain"]["cpu_ms"] / out["chunked"]["cpu_ms"], 2),
                "same_loss": abs(out["plain"]["loss"] - out["chunked"]["loss"]) < 1e-4,
            }
        )
    )


if __name__ == "__main__":
    main()
