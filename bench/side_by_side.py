"""A gptlab recipe and the nanoGPT-style yardstick trained in turns, in ONE process: prints ONE JSON line.

    python bench/side_by_side.py [--recipe best|reference] [--blocks 50] [--data FILE] [key=value ...]

Two runs one after the other are not comparable on a machine whose speed drifts (a 2-core cloud
VM here varies by 25 % within minutes). So both runs are cut into ``--blocks`` blocks and trained
in turns, the recipe's block first, then the yardstick's, then the other order, and so on: each
side sees the same machine state. Each side's time is the sum of its blocks: training steps only
(batch, forward, backward, optimizer step; the recipe's compilation included), no evaluation or
checkpoints, the way ``train_wall_s`` counts them. The recipe's ``val_loss`` is measured at the end
over the whole validation split in float32, as ``bench/train_shakespeare_char.py`` does.

The recipe steps through gptlab's own trainer (``gptlab.train.loop._Trainer.train_step``, the step
that ``gptlab train`` runs); the yardstick is ``bench/baseline_minimal.py``'s ``MinimalRun``. Both run on
the CPU, where the yardstick runs; ``bench/gpu.py`` compares the two on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: bench/ imports as the package `bench`
from bench.baseline_minimal import BATCH, BLOCK, MinimalRun  # noqa: E402
from bench.train_shakespeare_char import DEFAULT_DATA, RECIPES  # noqa: E402


def cuts(steps: int, blocks: int) -> list[int]:
    """Block boundaries ``0 = c_0 < … < c_blocks = steps``, as even as integers allow."""
    return [round(i * steps / blocks) for i in range(blocks + 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="best")
    parser.add_argument("--blocks", type=int, default=50)
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--baseline-steps", type=int, default=2000)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)

    import torch

    from gptlab.data import TokenDataset, prepare
    from gptlab.evaluate.loss import evaluate_tokens
    from gptlab.train import distributed
    from gptlab.train.config import build_config
    from gptlab.train.loop import _Trainer

    cfg = build_config(RECIPES[args.recipe], ["progress=false", "device=cpu", *args.overrides])
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        prepare([args.data], data_dir, tokenizer="char", val_fraction=0.1)
        info = distributed.setup(cfg.device)
        trainer = _Trainer(cfg, data_dir, Path(tmp) / "run", False, info)
        threads = torch.get_num_threads()  # the recipe's setting; the yardstick runs with the same
        baseline = MinimalRun(args.data, args.baseline_steps)
        ours_cuts, base_cuts = cuts(cfg.max_steps, args.blocks), cuts(args.baseline_steps, args.blocks)
        ours_s, base_s, ratios, last = 0.0, 0.0, [], float("nan")
        for b in range(args.blocks):
            times = {}
            for side in ("ours", "base") if b % 2 == 0 else ("base", "ours"):
                t0 = time.perf_counter()
                if side == "ours":
                    while trainer.step < ours_cuts[b + 1]:
                        trainer.train_step()
                else:
                    for it in range(base_cuts[b], base_cuts[b + 1]):
                        last = baseline.step(it)
                times[side] = time.perf_counter() - t0
            ours_s, base_s = ours_s + times["ours"], base_s + times["base"]
            ratios.append(times["ours"] / times["base"])
        model = trainer.model
        model.eval()
        ds = TokenDataset(data_dir)
        val = evaluate_tokens(model, ds.split("val"), 64, ds.bytes_per_token("val"))
    print(
        json.dumps(
            {
                "bench": "side_by_side",
                "recipe": args.recipe,
                "steps": trainer.step,
                "train_s": round(ours_s, 2),
                "val_loss": round(val.loss, 4),
                "baseline_steps": args.baseline_steps,
                "baseline_train_s": round(base_s, 2),
                "baseline_last_loss": round(last, 4),
                "time_ratio": round(ours_s / base_s, 3),  # < 1: the recipe trained in less time
                "block_ratio_median": round(statistics.median(ratios), 3),
                "tokens_per_s_ratio": round(
                    (trainer.tokens_per_step * trainer.step / ours_s)
                    / (BATCH * BLOCK * args.baseline_steps / base_s),
                    3,
                ),
                "blocks": args.blocks,
                "dtype": trainer.resolved["dtype"],
                "attention": trainer.resolved["attention"],
                "compile": trainer.resolved["compile"],
                "cpu": trainer.resolved["machine"],
                "threads": threads,
                "torch": torch.__version__,
                "loadavg_at_start": round(load_start, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
