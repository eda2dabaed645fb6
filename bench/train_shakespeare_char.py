"""Character-level Tiny Shakespeare training benchmark: prints ONE JSON line.

    python bench/train_shakespeare_char.py --recipe reference|best [--data FILE] [--max-steps N] [key=value ...]

``reference`` is the nanoGPT-style baseline configuration (recipe ``reference``);
``best`` is gptlab's ``char-best`` recipe. The dataset is prepared (90/10
split) into a temporary directory; ``train_wall_s`` counts training steps only
(compilation included, evaluation and checkpoints excluded), ``wall_s`` the whole
run; ``steady_ms_per_step``/``steady_tokens_per_s`` exclude the first 50 steps (compilation,
warm-up), the way a per-iteration figure is read; ``val_loss`` is measured in float32 over the whole validation split at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

RECIPES = {"reference": "reference", "best": "char-best"}
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"


def _steady_ms_per_step(run_dir: Path, skip: int = 50) -> float | None:
    """Median-free steady state: mean step time after the first ``skip`` steps (compilation, warm-up)."""
    from gptlab.train.metrics import read_metrics

    times = [(r["step"], r["time_s"]) for r in read_metrics(run_dir / "metrics.jsonl") if "time_s" in r]
    if len(times) <= skip + 1:
        return None
    (s0, t0), (s1, t1) = times[skip], times[-1]
    return round(1000 * (t1 - t0) / (s1 - s0), 2)


def main() -> int:
    t0 = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="reference")
    parser.add_argument(
        "--data", default=str(DEFAULT_DATA), help="a text file (default: ../shared/data/tinyshakespeare.txt)"
    )
    parser.add_argument("--max-steps", type=int, help="override the recipe's max_steps")
    parser.add_argument("--keep", help="keep the run directory here instead of a temporary one")
    parser.add_argument("--steady-skip", type=int, default=50, help="steps left out of the steady state (50)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()

    from gptlab.checkpoint import load
    from gptlab.data import TokenDataset, prepare
    from gptlab.evaluate.loss import evaluate_tokens
    from gptlab.train import train
    from gptlab.train.config import build_config

    overrides = ["progress=false", *args.overrides]
    if args.max_steps is not None:
        overrides.append(f"max_steps={args.max_steps}")
    cfg = build_config(RECIPES[args.recipe], overrides)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        data_dir, run_dir = Path(tmp) / "data", Path(args.keep or Path(tmp) / "run")
        prepare([args.data], data_dir, tokenizer="char", val_fraction=0.1)
        result = train(cfg, data_dir, run_dir)
        resolved = json.loads((run_dir / "train_config.json").read_text())["resolved"]  # what auto chose
        steady = _steady_ms_per_step(run_dir, args.steady_skip)
        model, _ = load(run_dir)
        ds = TokenDataset(data_dir)
        val = evaluate_tokens(model, ds.split("val"), 64, ds.bytes_per_token("val"))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    import torch

    print(
        json.dumps(
            {
                "recipe": args.recipe,
                "steps": result.step,
                "tokens_per_s": round(result.tokens_per_s, 1),
                "ms_per_step": round(1000 * result.train_wall_s / max(result.step, 1), 2),
                "steady_ms_per_step": steady,
                "steady_tokens_per_s": steady and round(1000 * result.tokens / result.step / steady, 1),
                "train_wall_s": round(result.train_wall_s, 2),
                "wall_s": round(time.perf_counter() - t0, 2),
                "val_loss": round(val.loss, 4),
                "val_bpb": round(val.bits_per_byte, 4),
                "last_eval_val_loss": result.val_loss and round(result.val_loss, 4),
                "peak_rss_mb": round(rss_mb, 1),
                "dtype": resolved["dtype"],
                "dtype_setting": cfg.dtype,
                "attention": resolved["attention"],
                "device": resolved["device"],
                "cpu": resolved["machine"],
                "compile": resolved["compile"],
                "optimizer": cfg.optimizer,
                "block_size": cfg.model_config(65).block_size,
                "batch_size": cfg.batch_size,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "loadavg_at_start": round(load_start, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
