"""The ``seq2seq-toy`` recipe end to end: prints ONE JSON line.

    python bench/seq2seq_toy.py [--task reverse|sort] [--pairs N] [key=value ...]
    python bench/seq2seq_toy.py --write-data reverse.jsonl [--task reverse|sort] [--pairs N]

``--write-data FILE`` only writes the pairs (for ``gptlab prepare --format pairs FILE``) and exits.

Writes ``N`` distinct random strings and their task output as JSONL, prepares them
with ``--format pairs`` (5 % held out), trains the recipe, then decodes every held-out
source greedily (encoder once, cached cross-attention K/V) and reports the exact-match
rate. ``train_wall_s`` counts training steps only; ``wall_s`` the whole run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def write_pairs(path: Path, rows: list[dict[str, str]]) -> None:
    """One ``{"source": ..., "target": ...}`` object per line."""
    from gptlab.fileio import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def exact_match(model, tokenizer, data) -> tuple[float, int]:
    """Share of held-out pairs whose greedy target equals the reference exactly."""
    from gptlab.generate import SampleConfig
    from gptlab.generate.driver import target_ids

    src_rows, tgt_rows = data.rows("val")
    eos, pad = tokenizer.eot_id, data.pad_id
    config = SampleConfig(temperature=0.0, max_new_tokens=int(data.meta["target_len"]), stop_tokens=[eos])
    hits = 0
    for src, tgt in zip(src_rows, tgt_rows, strict=True):
        source = [int(t) for t in src if t != pad]
        want = [int(t) for t in tgt if t != pad][1:-1]  # without BOS and EOS
        got, _ = target_ids(model, source, eos, config)
        hits += got == want
    return hits / len(src_rows), len(src_rows)


def main() -> int:
    t0 = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--task", default="reverse")
    p.add_argument("--pairs", type=int, default=6000)
    p.add_argument("--write-data", metavar="FILE", help="write the JSONL pairs to FILE and exit")
    p.add_argument("--keep", help="keep the run here instead of a temporary directory")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()

    from gptlab import checkpoint
    from gptlab.data.pairs import PairDataset, prepare_pairs, toy_pairs
    from gptlab.train import build_config, train

    if args.write_data:
        write_pairs(Path(args.write_data), toy_pairs(args.task, args.pairs, seed=0))
        print(json.dumps({"wrote": args.write_data, "task": args.task, "pairs": args.pairs}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        jsonl = root / f"{args.task}.jsonl"
        write_pairs(jsonl, toy_pairs(args.task, args.pairs, seed=0))
        prepare_pairs([jsonl], root / "data", val_fraction=0.05)
        cfg = build_config("seq2seq-toy", ["progress=false", *args.overrides])
        result = train(cfg, root / "data", root / "run")
        model, tokenizer = checkpoint.load(root / "run")
        data = PairDataset(root / "data")
        t_eval = time.perf_counter()
        rate, n = exact_match(model, tokenizer, data)
        record = {
            "bench": "seq2seq_toy",
            "task": args.task,
            "exact_match": round(rate, 4),
            "held_out_pairs": n,
            "steps": result.step,
            "val_loss": result.val_loss,
            "train_wall_s": round(result.train_wall_s, 1),
            "eval_wall_s": round(time.perf_counter() - t_eval, 1),
            "wall_s": round(time.perf_counter() - t0, 1),
            "threads": cfg.threads,
            "overrides": args.overrides,
        }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
