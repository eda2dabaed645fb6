"""What recording and verifying a checkpoint's SHA-256 costs: save (with checksums) and load (verified)
of a model of about ``--mb`` MB of float32 weights, against verification alone. Prints one JSON line.

    PYTHONPATH=src python bench/checkpoint_checksums.py [--mb 500] [--dir /tmp/gptlab-ckpt-bench]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=500.0)
    ap.add_argument("--dir", default="/tmp/gptlab-ckpt-bench")
    args = ap.parse_args()
    import gptlab
    from gptlab.checkpoint.integrity import verify_checksums, write_checksums
    from gptlab.model import GPT, GPTConfig

    d = 1024
    layers = max(1, round(args.mb * 2**20 / 4 / (12 * d * d)))
    model = GPT(GPTConfig(vocab_size=256, block_size=64, n_layer=layers, n_head=16, n_embd=d))
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    gptlab.save(model, None, root / "ckpt")
    save_s = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in (root / "ckpt").iterdir())
    t0 = time.perf_counter()
    write_checksums(root / "ckpt")
    record_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    verify_checksums(root / "ckpt")
    verify_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    gptlab.load(root / "ckpt")
    load_s = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "checkpoint_checksums",
                "bytes": size,
                "save_with_checksums_s": round(save_s, 3),
                "record_checksums_s": round(record_s, 3),
                "verify_s": round(verify_s, 3),
                "load_verified_s": round(load_s, 3),
                "verify_MB_per_s": round(size / 2**20 / verify_s, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
