"""Activation memory with and without activation checkpointing (``activation_checkpointing = blocks``).

gpt2 preset, context 1024, batch 1, float32 on the CPU. Each mode runs in a fresh process with a
fixed malloc mmap threshold (so freed tensors leave the resident set at once); the figures are
resident-memory growth: ``held`` = after the forward (what waits for the backward), ``peak`` =
the highest point of forward + backward, both above the state before the forward (weights and
gradients already allocated by a warm-up step). Prints one JSON line.

    PYTHONPATH=src python bench/activation_memory.py [--preset gpt2] [--context 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Resident-memory growth above the level at entry; ``peak``: its highest point (sampled every 2 ms)."""

    def __enter__(self) -> PeakRSS:
        self.base, self.peak = _rss(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss() - self.base)
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def in_fresh_processes(script: str, flag: str, values: tuple[str, ...], *args: str) -> dict[str, dict]:
    """``python SCRIPT ARGS FLAG VALUE`` for each value, each in a fresh process with a fixed malloc
    mmap threshold (freed tensors leave the resident set at once) → ``{value: its JSON line}``."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    return {
        v: json.loads(
            subprocess.run(
                [sys.executable, script, *args, flag, v], capture_output=True, text=True, env=env, check=True
            ).stdout
        )
        for v in values
    }


def _measure(preset: str, context: int, mode: str) -> dict:
    import torch

    from gptlab.model import GPT, GPTConfig
    from gptlab.train.checkpointing import apply_activation_checkpointing

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    model = GPT(GPTConfig.preset(preset, block_size=context))
    apply_activation_checkpointing(model, mode)
    x = torch.randint(0, model.config.vocab_size, (1, context))
    model(x, x)[1].backward()  # warm-up: gradients exist from now on
    t0 = time.perf_counter()
    with PeakRSS() as rss:
        loss = model(x, x)[1]
        held = _rss() - rss.base
        loss.backward()
    return {"held_bytes": held, "peak_bytes": rss.peak, "step_s": round(time.perf_counter() - t0, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--mode")
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(_measure(args.preset, args.context, args.mode)))
        return
    args_ = ("--preset", args.preset, "--context", str(args.context))
    out = in_fresh_processes(__file__, "--mode", ("none", "blocks"), *args_)
    print(
        json.dumps(
            {
                "bench": "activation_memory",
                "preset": args.preset,
                "context": args.context,
                "batch": 1,
                **out,
                "held_ratio": round(out["none"]["held_bytes"] / out["blocks"]["held_bytes"], 2),
                "peak_ratio": round(out["none"]["peak_bytes"] / out["blocks"]["peak_bytes"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
