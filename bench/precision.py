"""What bf16 costs on this CPU: matrix products, Muon's Newton–Schulz, bf16 weights × many rows. ONE JSON line.

    python bench/precision.py [--threads 1]

* ``matmul_ms``: a (1536×128)·(128×512) product (a training-sized one) in float32 and bfloat16;
* ``muon_step_ms``: one Muon step over the ``char-best`` recipe's block matrices with
  ``torch.optim.Muon`` (Newton–Schulz in bf16) and ``gptlab.train.muon.Float32Muon``;
* ``bf16_rows_ms``: bf16 weights (3072×768) times R rows, as ``F.linear`` in bf16 and converted
  to float32 (what ``PackedBF16Linear`` does from ``UPCAST_MIN_ROWS`` rows on where bf16 is emulated);
* ``plan``: what ``gptlab.hardware`` chose here. Medians of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: bench/ imports as the package `bench`

from bench.roofline import median_s  # noqa: E402
from gptlab import hardware  # noqa: E402
from gptlab.model import GPT  # noqa: E402
from gptlab.train.config import build_config  # noqa: E402
from gptlab.train.muon import Float32Muon  # noqa: E402
from gptlab.train.optim import _split  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    """Median of ``repeats`` timings after a warm-up, in ms (every repeat, however slow)."""
    return round(1e3 * median_s(fn, repeats, budget_s=math.inf), 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    torch.manual_seed(0)
    a, b = torch.randn(1536, 128), torch.randn(128, 512)
    ab, bb = a.bfloat16(), b.bfloat16()
    matmul = {
        "float32": median_ms(lambda: a @ b, args.repeats),
        "bfloat16": median_ms(lambda: ab @ bb, args.repeats),
    }

    model = GPT(build_config("char-best").model_config(65))
    hidden, _, _ = _split(model)
    for q in hidden:
        q.grad = torch.randn_like(q)
    muon = {}
    for name, cls in (("torch_bf16", torch.optim.Muon), ("float32", Float32Muon)):
        opt = cls(hidden, lr=0.03, momentum=0.95, weight_decay=0.0, adjust_lr_fn="original")
        muon[name] = median_ms(opt.step, args.repeats)

    w = torch.randn(3072, 768).bfloat16()
    rows = {}
    for r in (1, 2, 8, 32, 128):
        x = torch.randn(r, 768).bfloat16()
        rows[r] = {
            "bf16": median_ms(lambda x=x: F.linear(x, w), args.repeats),
            "float32": median_ms(lambda x=x: F.linear(x.float(), w.float()), args.repeats),
        }
    print(
        json.dumps(
            {
                "matmul_ms": matmul,
                "matmul_bf16_slowdown": round(matmul["bfloat16"] / matmul["float32"], 1),
                "muon_step_ms": muon,
                "muon_matrices": len(hidden),
                "bf16_rows_ms": rows,
                "plan": hardware.plan().to_dict(),
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "threads": args.threads,
                "torch": torch.__version__,
                "loadavg_at_start": round(load_start, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
