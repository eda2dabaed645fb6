"""A masked-language encoder on Tiny Shakespeare (characters): prints ONE JSON line.

    python bench/mlm_shakespeare.py [--data FILE] [--eval-batches N] [key=value ...]

Prepares the text (90/10 split), trains the ``mlm-char`` recipe (a bidirectional encoder,
``objective=mlm``: BERT's 15 % / 80-10-10 corruption; ``key=value`` overrides its settings),
then corrupts the validation split the same way (fixed seed) and reports top-1 accuracy at the
positions replaced by ``[MASK]`` (``masked_acc``) and at every chosen position (``chosen_acc``,
which includes the 10 % random and 10 % unchanged ones). ``train_wall_s`` counts the training
steps; ``train_cpu_s`` is the CPU time of the whole training call (all threads, evaluations and
checkpoints included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

DEFAULT_DATA = (
    Path(os.environ.get("GPTLAB_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    / "tinyshakespeare.txt"
)
RECIPE = "mlm-char"


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
    p.add_argument("--eval-batches", type=int, default=40, help="validation batches of 32 windows")
    p.add_argument("--keep", help="keep the data and the run here instead of a temporary directory")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()

    from gptlab import checkpoint
    from gptlab.data import prepare
    from gptlab.train import build_config, train
    from gptlab.train.objectives import make_objective

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        prepare([args.data], root / "data", block_size=128)
        cfg = build_config(RECIPE, ["progress=false", *args.overrides])
        cpu0 = time.process_time()
        result = train(cfg, root / "data", root / "run")
        train_cpu_s = time.process_time() - cpu0  # every thread of this process: load-independent
        model, _ = checkpoint.load(root / "run")
        record = {
            "bench": "mlm_shakespeare",
            "recipe": RECIPE,
            **accuracy(model, make_objective(cfg, root / "data"), args.eval_batches),
            "steps": result.step,
            "val_loss": result.val_loss,
            "train_wall_s": round(result.train_wall_s, 1),
            "train_cpu_s": round(train_cpu_s, 1),
            "wall_s": round(time.perf_counter() - t0, 1),
            "threads": cfg.threads,
            "overrides": args.overrides,
        }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
