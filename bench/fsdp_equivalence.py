"""The reference recipe in float32 for 50 steps: 2 FSDP gloo ranks (batch 6 each) against one process
(batch 12), with and without activation checkpointing. Prints one JSON line with the largest weight
differences (all tensors, and all but the attention biases).

    PYTHONPATH=src python bench/fsdp_equivalence.py [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SHARED = Path(
    os.environ.get("GPTLAB_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


def _weights(run: Path, scratch: Path) -> dict:
    from gptlab import checkpoint as ckpt
    from gptlab.checkpoint import sharded

    latest = ckpt.resolve_checkpoint(run)
    if sharded.is_sharded(latest):
        latest = sharded.consolidate(run, scratch / f"{run.name}-consolidated")
    return ckpt.read_tensors(latest / ckpt.WEIGHTS_FILE)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--dir", default="/tmp/gptlab-fsdp-bench")
    args = ap.parse_args()
    from gptlab.data import prepare

    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    prepare([SHARED / "tinyshakespeare.txt"], root / "ds", block_size=64)
    common = ["--config", "reference", "dtype=float32", "compile=false", "attention=sdpa", "progress=false"]
    common += [f"max_steps={args.steps}", "eval_every=100000", "ckpt_every=100000", "threads=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {
        "one": (1, ["batch_size=12"]),
        "one_ac": (1, ["batch_size=12", "activation_checkpointing=blocks"]),
        "fsdp": (2, ["batch_size=6", "strategy=fsdp"]),
        "fsdp_ac": (2, ["batch_size=6", "strategy=fsdp", "activation_checkpointing=blocks"]),
    }
    for name, (n, extra) in runs.items():
        launch = [sys.executable, "-m", "gptlab"]
        if n > 1:
            launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
            launch += [f"--log-dir={root / 'torchrun-logs'}", "-m", "gptlab"]
        cmd = [*launch, "train", "--data", str(root / "ds"), "--out", str(root / name), *common, *extra]
        subprocess.run(cmd, check=True, env=env, capture_output=True)
    ref = _weights(root / "one", root)
    out = {}
    for name in ("one_ac", "fsdp", "fsdp_ac"):
        w = _weights(root / name, root)
        diffs = {k: float((w[k] - ref[k]).abs().max()) for k in ref}
        out[name] = {
            "max_abs_diff": max(diffs.values()),
            "max_abs_diff_without_attention_biases": max(
                v for k, v in diffs.items() if "attn" not in k or "bias" not in k
            ),
            "worst": max(diffs, key=diffs.get),
        }
    print(
        json.dumps({"bench": "fsdp_equivalence", "recipe": "reference (float32)", "steps": args.steps, **out})
    )


if __name__ == "__main__":
    main()
