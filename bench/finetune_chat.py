"""Instruction fine-tuning on a synthetic chat task, with and without the assistant-only loss mask.

    python bench/finetune_chat.py [--steps N] [--no-compare]

The task is a fixed answer format the base model does not have: the user sends two
three-letter words ``"abc xyz"`` and the assistant must answer ``"Answer: xyz+abc."``.
Held-out examples use word pairs never seen in training. A small character-level base
(random weights, saved as a gptlab checkpoint) is fine-tuned through the real pipeline
(``prepare --format chat`` → ``train init=BASE`` → ``gptlab.load``), then answers greedily;
the score is exact match of the reply. Prints ONE JSON line: accuracy with the mask and,
for comparison, without it (``--prompt-loss``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ALPHABET = "abcdefghijklmnopqrstuvwxyzA+.: \n"


def make_task(seed: int = 0, n_words: int = 24, n_val: int = 60) -> tuple[list[dict], list[tuple[str, str]]]:
    """``(train records, held-out (prompt, answer) pairs)``; held-out word pairs never occur in training."""
    rng = random.Random(seed)
    words = sorted(
        {"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)) for _ in range(n_words)}
    )
    pairs = [(a, b) for a in words for b in words if a != b]
    rng.shuffle(pairs)
    held, seen = pairs[:n_val], pairs[n_val:]

    def record(a: str, b: str) -> dict:
        return {
            "messages": [
                {"role": "user", "content": f"{a} {b}"},
                {"role": "assistant", "content": answer(a, b)},
            ]
        }

    return [record(a, b) for a, b in seen], [(f"{a} {b}", answer(a, b)) for a, b in held]


def answer(a: str, b: str) -> str:
    return f"Answer: {b}+{a}."


def exact_match(run: Path, held: list[tuple[str, str]]) -> float:
    """Share of held-out prompts whose greedy reply (up to ``<|im_end|>``) is exactly the answer."""
    import torch

    import gptlab
    from gptlab.data.chat import _chatml, renderer

    model, tok = gptlab.load(run)
    render, _ = renderer(tok, "auto") if tok is not None else (_chatml, "chatml")
    prompts = [
        tok.encode(render([{"role": "user", "content": p}], True), allowed_special="all") for p, _ in held
    ]
    idx = torch.tensor(prompts)  # every prompt has the same length: two three-letter words
    n_new = max(len(tok.encode(a)) for _, a in held) + 1
    with torch.no_grad():
        out = model.generate(idx, n_new, temperature=0.0)[:, idx.size(1) :]
    end = tok.special_tokens["<|im_end|>"]
    replies = [tok.decode(row[: row.index(end)] if end in row else row) for row in out.tolist()]
    return sum(r == a for r, (_, a) in zip(replies, held)) / len(held)


def run_task(root: Path, masked: bool, steps: int, seed: int = 0) -> dict:
    """Prepare, fine-tune (full) and score one variant; returns its figures."""
    import torch

    from gptlab import checkpoint as ckpt
    from gptlab.data import ChatOptions, prepare_chat
    from gptlab.model import GPT, GPTConfig
    from gptlab.tokenizers import CharTokenizer
    from gptlab.train import train
    from gptlab.train.config import build_config

    records, held = make_task(seed)
    base = root / "base"
    if not base.exists():
        tok = CharTokenizer.from_text(ALPHABET, special_tokens=SPECIALS)
        torch.manual_seed(seed)
        cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=4, n_embd=64, pos="rope")
        ckpt.save(GPT(cfg), tok, base)
        (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    name = "masked" if masked else "unmasked"
    options = ChatOptions(prompt_loss=not masked)
    prepare_chat(
        [root / "chat.jsonl"], root / f"ds-{name}", tokenizer=str(base), block_size=63, options=options
    )
    before = exact_match(base, held)
    settings = [
        f"init={base}",
        "finetune=full",
        "model.block_size=63",
        f"max_steps={steps}",
        "batch_size=16",
        "lr=3e-3",
        "min_lr=3e-4",
        "warmup_steps=20",
        "weight_decay=0.0",
        "eval_every=100000",
        "ckpt_every=100000",
        "progress=false",
        "threads=1",
        f"seed={seed}",
    ]
    t0 = time.perf_counter()
    result = train(build_config(None, settings), root / f"ds-{name}", root / f"run-{name}")
    return {
        f"{name}_exact_match": exact_match(root / f"run-{name}", held),
        f"{name}_train_s": round(time.perf_counter() - t0, 1),
        f"{name}_final_loss": round(result.train_loss or float("nan"), 4),
        "base_exact_match": before,
        "held_out": len(held),
        "train_examples": len(records),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--no-compare", action="store_true", help="only the masked run")
    args = ap.parse_args()
    out: dict = {"bench": "finetune_chat", "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        for masked in (True,) if args.no_compare else (True, False):
            out.update(run_task(Path(tmp), masked, args.steps))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    # the source tree, in place of this script's folder (whose gguf.py would shadow the gguf package)
    sys.path[0] = str(Path(__file__).resolve().parents[1] / "src")
    raise SystemExit(main())
