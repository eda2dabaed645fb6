"""A masked-language encoder on Tiny Shakespeare (characters): prints ONE JSON line.

    python bench/mlm_shakespeare.py [--data FILE] [--max-steps N] [key=value ...]

Prepares the text (90/10 split), trains a bidirectional encoder with ``objective=mlm``
(BERT's 15 % / 80-10-10 corruption), then corrupts the validation split the same way
(fixed seed) and reports top-1 accuracy at the positions replaced by ``[MASK]``
(``masked_acc``) and at every chosen position (``chosen_acc``, which includes the 10 %
random and 10 % unchanged ones).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"
SETTINGS = [
    "objective=mlm",
    "batch_size=32",
    "lr=2e-3",
    "min_lr=2e-4",
    "warmup_steps=50",
    "weight_decay=0.0",
    "eval_every=1000000",
    "eval_batches=10",
    "model.block_size=128",
    "model.n_layer=4",
    "model.n_head=4",
    "model.n_embd=128",
    "model.pos=rope",
    "model.norm=rmsnorm",
    "model.mlp=swiglu",
    "model.bias=false",
]


@torch.no_grad()
def accuracy(model, objective, n_batches: int = 40) -> dict[str, float]:
    from gptlab.data import eval_batches
    from gptlab.train.objectives import _generator, mlm_mask

    model.eval()
    T, mask_id, V = model.config.block_size, objective.mask_id, model.config.vocab_size
    hit_m = n_m = hit_c = n_c = 0
    for i, (x, _) in enumerate(eval_batches(objective.data.split("val"), T, 32, n_batches)):
        inputs, targets = mlm_mask(x, mask_id, V, _generator(12345, i))
        pred = model(inputs).argmax(-1)
        chosen, masked = targets != -1, inputs == mask_id
        hit_c += int((pred == targets)[chosen].sum())
        n_c += int(chosen.sum())
        hit_m += int((pred == targets)[masked].sum())
        n_m += int(masked.sum())
    return {"masked_acc": round(hit_m / n_m, 4), "chosen_acc": round(hit_c / n_c, 4), "masked_positions": n_m}


def main() -> int:
    t0 = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()

    from gptlab import checkpoint
    from gptlab.data import prepare
    from gptlab.train import build_config, train
    from gptlab.train.objectives import make_objective

    with tempfile.TemporaryDirectory() as tmp:
        prepare([args.data], Path(tmp) / "data", block_size=128)
        cfg = build_config(
            None, [*SETTINGS, f"max_steps={args.max_steps}", "progress=false", *args.overrides]
        )
        result = train(cfg, Path(tmp) / "data", Path(tmp) / "run")
        model, _ = checkpoint.load(Path(tmp) / "run")
        record = {
            "bench": "mlm_shakespeare",
            **accuracy(model, make_objective(cfg, Path(tmp) / "data")),
            "steps": result.step,
            "val_loss": result.val_loss,
            "train_wall_s": round(result.train_wall_s, 1),
            "wall_s": round(time.perf_counter() - t0, 1),
            "overrides": args.overrides,
        }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
