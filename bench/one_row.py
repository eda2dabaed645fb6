"""A decode step's one-row product: each format's library kernel against the compiled reduction. One JSON line.

    python bench/one_row.py                    # SmolLM2's matrix shapes, 2 threads
    python bench/one_row.py --decode smollm2   # and whole decode steps of a model, each way

``gptlab.hardware.one_row_kernel`` chooses between the two per CPU kind; this measures what it weighs.
Per matrix shape (N outputs, K inputs) and weight format, microseconds per one-row product (median of
``--rounds``, the two kernels timed in turns):

* ``library``: what a layer calls without the compiled kernel: fp32 ``F.linear`` (MKL), bf16 through
  oneDNN's prepacked weight (``F.linear`` where oneDNN cannot pack bf16), int8
  ``_weight_int8pack_mm``, each with the activations' dtype ``gptlab.model.quantized.activation_dtype``
  gives on this CPU (bf16 where bf16 is native, else float32);
* ``compiled``: ``gptlab.model.quantized.gemv`` through ``torch.compile`` (one pass over the weights);
* ``planes`` (int8 only): the int8 matrix in blocks of 32 as two int4 planes through the int4 kernel
  (``gptlab.model.int4.q8_planes``), how a GGUF file's Q8_0 matrices are held below native bf16
  (``gptlab.hardware.int8_blocks``).

With ``--decode SRC``: greedy tokens per second of 64-token decodes (layer by layer, after a 6-token
prompt), in fresh processes that alternate the two choices, and whether their greedy tokens agree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: bench/ imports as `bench`

#: SmolLM2-135M's matrices: the head (tied to the token table), mlp up/gate, mlp down, attention out
SHAPES = [(49152, 576), (1536, 576), (576, 1536), (576, 576)]


def per_call_us(fn: Any, calls: int) -> float:
    for _ in range(5):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def kernels(n: int, k: int) -> dict[str, dict[str, Any]]:
    """format → {"library": fn, "compiled": fn} for one (n, k) matrix."""
    from gptlab.model.int4 import (
        INT4_GROUP,
        Int4Linear,
        int4_supported,
        kernel_packed,
        kernel_scales,
        q8_planes,
    )
    from gptlab.model.quantized import _GEMV, activation_dtype, onednn_bf16

    act = activation_dtype("cpu")
    x = torch.randn(1, k).to(act)
    w = torch.randn(n, k)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    s = torch.rand(n).to(act)
    wb = w.bfloat16()
    packed = torch.ops.mkldnn._reorder_linear_weight(wb, None) if onednn_bf16() else None
    xb = x.bfloat16()

    def bf16_library() -> torch.Tensor:
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(xb, packed, None, "none", [], "")
        return F.linear(x, wb.to(x.dtype))

    int8: dict[str, Any] = {
        "library": lambda: torch.ops.aten._weight_int8pack_mm(x, q, s),
        "compiled": lambda: _GEMV[torch.int8](x, q, s, None),
    }
    if int4_supported(n, 2 * k):
        parts = q8_planes(q, s.float()[:, None].expand(n, k // INT4_GROUP).contiguous())
        planes = Int4Linear.from_packed(kernel_packed(parts.q), kernel_scales(parts), planes=2)
        int8["planes"] = lambda: planes(x)
    return {
        "fp32": {
            "library": lambda: F.linear(x.float(), w),
            "compiled": lambda: _GEMV[torch.float32](x.float(), w, None, None),
        },
        "bf16": {"library": bf16_library, "compiled": lambda: _GEMV[torch.bfloat16](x, wb, None, None)},
        "int8": int8,
    }


DECODE = """
import json, statistics, sys, time, torch
from gptlab import hardware
choice = sys.argv[2]
hardware.one_row_kernel = lambda device, machine=None: choice
torch.set_num_threads(int(sys.argv[3]))
import gptlab
from gptlab.generate import generate_ids, prepare_decoding
model, tok = gptlab.load(sys.argv[1], quantize=None if sys.argv[4] == "keep" else sys.argv[4])
prepare_decoding(model, compile="off")
ids = torch.tensor([tok.encode("The capital of France is")])
def timed(n):
    t = time.perf_counter(); out = generate_ids(model, ids, n, temperature=0.0); return time.perf_counter() - t, out
timed(64)
rates = []
for _ in range(3):
    long, out = timed(64); short, _ = timed(1); rates.append(63 / (long - short))
print(json.dumps({"tokens_per_s": statistics.median(rates), "tokens": out[0].tolist()}))
"""


def decode(src: str, weights: str, threads: int, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"library": [], "compiled": []}
    for _ in range(rounds):
        for choice in runs:  # in turns
            out = subprocess.run(
                [sys.executable, "-c", DECODE, src, choice, str(threads), weights],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
            )
            runs[choice].append(json.loads(out.stdout.strip().splitlines()[-1]))
    tps = {c: round(statistics.median(r["tokens_per_s"] for r in v), 1) for c, v in runs.items()}
    return {
        "weights": weights,
        "tokens_per_s": tps,
        "library_over_compiled": round(tps["library"] / tps["compiled"], 2),
        "greedy_tokens_equal": runs["library"][0]["tokens"] == runs["compiled"][0]["tokens"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="turns of each kernel (median)")
    p.add_argument("--calls", type=int, default=100, help="products timed per turn")
    p.add_argument("--decode", help="a model source to decode with each choice (e.g. smollm2)")
    p.add_argument(
        "--weights", default="keep,int8,bf16,fp32", help="formats for --decode (keep: as the file ships)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from gptlab.hardware import one_row_kernel

    result: dict[str, Any] = {
        "bench": "one_row",
        "threads": args.threads,
        "chosen_here": one_row_kernel("cpu"),
    }
    shapes: dict[str, Any] = {}
    with torch.inference_mode():
        for n, k in SHAPES:
            for fmt, pair in kernels(n, k).items():
                times: dict[str, list[float]] = {name: [] for name in pair}
                for _ in range(args.rounds):
                    for name, fn in pair.items():
                        times[name].append(per_call_us(fn, args.calls))
                us = {name: statistics.median(t) for name, t in times.items()}
                shapes[f"{fmt} {n}x{k}"] = {
                    **{f"{name}_us": round(t, 1) for name, t in us.items()},
                    **{
                        f"{name}_over_library": round(t / us["library"], 2)
                        for name, t in us.items()
                        if name != "library"
                    },
                }
    result["per_matrix"] = shapes
    if args.decode:
        result["decode"] = [
            decode(args.decode, w, args.threads, max(2, args.rounds // 2)) for w in args.weights.split(",")
        ]
    result["cpu"] = torch.backends.cpu.get_cpu_capability()
    result["torch"] = torch.__version__
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
