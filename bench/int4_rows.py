"""An int4 (or int8) matrix times a few rows: the library kernel against the float GEMM. One JSON line.

    python bench/int4_rows.py                       # SmolLM2's matrix shapes, 2 threads
    python bench/int4_rows.py --rows 16,64,96,128,256
    python bench/int4_rows.py --weights int8        # _weight_int8pack_mm against the float product
    python bench/int4_rows.py --dequantise          # the dequantisation alone: eager and compiled

``Int4Linear`` multiplies fewer than ``gptlab.model.int4.int4_dequant_rows(activations)`` rows with
``_weight_int4pack_mm_for_cpu`` (each weight read once per 4 rows), and more by dequantising the
matrix (``Int4Linear.dequantized``, a cost per weight) and multiplying in the activations' dtype (bf16
where it is native, else float32). This times both, in turns, at each row count, per matrix shape
(milliseconds, median of ``--rounds``), and per shape the smallest row count measured at which the
dequantised product is the faster one (``dequantised_faster_from``; null where it never was).

``--weights int8``: ``Int8Linear`` multiplies fewer than ``gptlab.model.quantized.int8_float_rows``
rows with ``_weight_int8pack_mm`` and more as ``(x · qᵀ) ⊙ s`` with q converted to the activations'
dtype (exactly: |q| ≤ 127) and the float kernels; the same two ways are timed.

``--dequantise``: an int4 matrix dequantised to the activations' dtype alone, per shape, four ways in
turns: ``_groups_dequantized`` (what eager code runs) eagerly and compiled by ``torch.compile``, and
``_blocks_dequantized`` (what a compiled graph such as the kept prompt pass runs) the same two ways;
all four give the same bits (checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gptlab.model.int4 import (  # noqa: E402
    INT4_GROUP,
    Int4Linear,
    _blocks_dequantized,
    _groups_dequantized,
    int4_dequant_rows,
)
from gptlab.model.quantized import Int8Linear, activation_dtype, int8_float_rows  # noqa: E402

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]  # SmolLM2: q/o, k/v, gate/up, down


def per_call_ms(fn: Callable[[], object], calls: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e3


def kernel(layer: Int4Linear, x: torch.Tensor) -> torch.Tensor:
    """The product through the int4 kernel (what ``Int4Linear`` runs below ``int4_dequant_rows``)."""
    sz = layer.scales_and_zeros
    return torch.ops.aten._weight_int4pack_mm_for_cpu(
        x.to(sz.dtype).contiguous(), layer.weight, INT4_GROUP, sz
    )


def dequantised(layer: Int4Linear, x: torch.Tensor) -> torch.Tensor:
    """The product through the matrix dequantised to ``x``'s dtype (what it runs from there on)."""
    return torch.nn.functional.linear(x, layer.dequantized(x.dtype))


def int8_kernel(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """The product through ``_weight_int8pack_mm`` (what ``Int8Linear`` runs below ``int8_float_rows``)."""
    assert layer.scales is not None
    return torch.ops.aten._weight_int8pack_mm(x.contiguous(), layer.weight, layer.scales.to(x.dtype))


def int8_float(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """``(x · qᵀ) ⊙ s`` through the float kernels (what it runs from there on)."""
    assert layer.scales is not None
    return torch.nn.functional.linear(x, layer.weight.to(x.dtype)) * layer.scales.to(x.dtype)


def dequantisations(
    shapes: list[tuple[int, ...]], dtype: torch.dtype, rounds: int, calls: int
) -> dict[str, Any]:
    """Per N×K shape, milliseconds a dequantisation (median of ``rounds`` turns of ``calls``), four ways."""
    out: dict[str, Any] = {}
    for n, k in shapes:
        layer = Int4Linear(torch.nn.Linear(k, n, bias=False))
        block, blocked = layer.layout
        if not blocked or n % block:
            continue
        groups = partial(_groups_dequantized, layer.weight, layer.scales_and_zeros, n, k, layer.layout, dtype)
        blocks = partial(_blocks_dequantized, layer.weight, layer.scales_and_zeros, n, k, block, dtype)
        ways = {
            "groups_eager": groups,
            "groups_compiled": partial(torch.compile(_groups_dequantized), *groups.args),
            "blocks_eager": blocks,
            "blocks_compiled": partial(torch.compile(_blocks_dequantized), *blocks.args),
        }
        expected = groups()
        if not all(torch.equal(fn(), expected) for fn in ways.values()):
            raise SystemExit(f"error: the ways of dequantising a {n}×{k} matrix differ")
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(rounds):
            for w, fn in ways.items():
                times[w].append(per_call_ms(fn, calls))
        out[f"{n}x{k}"] = {f"{w}_ms": round(statistics.median(t), 3) for w, t in times.items()}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="8,16,32,64,96,128,192", help="comma-separated row counts")
    p.add_argument("--rounds", type=int, default=3, help="turns of each way (median)")
    p.add_argument("--calls", type=int, default=10, help="products timed per turn")
    p.add_argument("--shapes", help="N×K shapes, e.g. 576x576,1536x576 (default: SmolLM2's)")
    p.add_argument("--weights", choices=("int4", "int8"), default="int4")
    p.add_argument("--dequantise", action="store_true", help="time the int4 dequantisation alone")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    act = activation_dtype("cpu")
    torch.manual_seed(0)
    if args.dequantise:
        with torch.inference_mode():
            shapes_ms = dequantisations([s for s in shapes if s[0] < 49152], act, args.rounds, args.calls)
        line = {
            "bench": "int4_rows",
            "dequantise": True,
            "threads": args.threads,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "activations": str(act).removeprefix("torch."),
            "shapes": shapes_ms,
        }
        print(json.dumps(line))
        return line
    out: dict[str, Any] = {}
    faster_from: dict[str, int | None] = {}
    with torch.inference_mode():
        for n, k in shapes:
            linear = torch.nn.Linear(k, n, bias=False)
            int8 = args.weights == "int8"
            layer = Int8Linear(linear, act) if int8 else Int4Linear(linear)
            line: dict[str, Any] = {}
            first = None
            for m in rows:
                x = torch.randn(m, k, dtype=act)
                kern_fn, deq_fn = (int8_kernel, int8_float) if int8 else (kernel, dequantised)
                ways = {"kernel": partial(kern_fn, layer, x), "dequantised": partial(deq_fn, layer, x)}
                times: dict[str, list[float]] = {w: [] for w in ways}
                for _ in range(args.rounds):
                    for w, fn in ways.items():
                        times[w].append(per_call_ms(fn, args.calls))
                kern, deq = (statistics.median(times[w]) for w in ways)
                line[str(m)] = {"kernel_ms": round(kern, 3), "dequantised_ms": round(deq, 3)}
                if first is None and deq < kern:
                    first = m
            out[f"{n}x{k}"] = line
            faster_from[f"{n}x{k}"] = first
    result = {
        "bench": "int4_rows",
        "weights": args.weights,
        "threads": args.threads,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "activations": str(act).removeprefix("torch."),
        "dequant_rows_now": (
            {f"{n}x{k}": int8_float_rows(act, n * k) for n, k in shapes}
            if args.weights == "int8"
            else int4_dequant_rows(act)
        ),
        "dequantised_faster_from": faster_from,
        "shapes": out,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
