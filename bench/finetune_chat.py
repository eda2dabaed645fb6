"""Instruction fine-tuning on a synthetic chat task, with and without the assistant-only loss mask.

    python bench/finetune_chat.py [--steps N] [--no-compare]            # a tiny random base, full
    python bench/finetune_chat.py --init SMOLLM2.gguf [--steps N]       # a real model, LoRA
    python bench/finetune_chat.py --write DIR                           # the real task's JSONL only

The task is a fixed answer format the base model does not have: the user sends two
words ``"abc xyz"`` and the assistant must answer ``"Answer: xyz+abc."``. Held-out
examples use word pairs never seen in training. The base is fine-tuned through the real
pipeline (``prepare --format chat`` → ``train init=BASE`` → load, merging a LoRA run),
then answers the held-out prompts greedily with the model's chat template, up to
``<|im_end|>``; the score is exact match of the reply. Prints ONE JSON line.

Without ``--init``, the base is a small character-level model with random weights (three-letter
random words; full fine-tuning), measured with the mask and, for comparison, without it
(``--prompt-loss``). With ``--init`` (a pretrained model: a GGUF file, a Hugging Face folder or a
gptlab checkpoint), the words are common English nouns and the ``finetune`` recipe (LoRA) trains,
with the mask; the base model's own score is the "before".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from gptlab.generate import generate_ids
from gptlab.sources import model_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ALPHABET = "abcdefghijklmnopqrstuvwxyzA+.: \n"
#: the real model's words: common English nouns (32 · 31 = 992 ordered pairs)
NOUNS = (
    "apple river stone cloud horse bread chair table music paper water glass house plant train money "
    "night smile dream ocean tiger sugar lemon queen honey storm forest garden window candle bridge island"
).split()


def make_task(
    seed: int = 0, n_words: int = 24, n_val: int = 60, vocab: list[str] | None = None
) -> tuple[list[dict], list[tuple[str, str]]]:
    """``(train records, held-out (prompt, answer) pairs)``; held-out word pairs never occur in training.

    The words are ``vocab`` or, without it, ``n_words`` random three-letter strings.
    """
    rng = random.Random(seed)
    words = sorted(
        vocab or {"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)) for _ in range(n_words)}
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


def exact_match(source: Path | str, held: list[tuple[str, str]]) -> float:
    """Share of held-out prompts whose greedy reply (up to ``<|im_end|>``) is exactly the answer."""
    return score(greedy_replies(source, held), held)


def score(replies: list[str], held: list[tuple[str, str]]) -> float:
    return sum(r == a for r, (_, a) in zip(replies, held)) / len(held)


def greedy_replies(source: Path | str, held: list[tuple[str, str]]) -> list[str]:
    """The greedy reply to each held-out prompt, up to ``<|im_end|>``.

    ``source`` is anything ``init=`` takes (a LoRA run loads merged). The prompts are rendered with
    the model's own chat template and answered in batches of equal length (no padding).
    """
    import torch

    from gptlab.data.chat import renderer
    from gptlab.sources import load_source

    model, tok = load_source(source)
    model.eval()
    render, _ = renderer(tok, "auto")
    prompts = [
        tok.encode(render([{"role": "user", "content": p}], True), allowed_special="all") for p, _ in held
    ]
    n_new = max(len(tok.encode(a)) for _, a in held) + 1
    end = tok.special_tokens["<|im_end|>"]
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(i)
    replies = [""] * len(held)
    for group in by_length.values():
        idx = torch.tensor([prompts[i] for i in group])  # (B, T): every prompt of the group is T tokens
        with torch.no_grad():
            out = generate_ids(model, idx, n_new, temperature=0.0)[:, idx.size(1) :]
        for i, row in zip(group, out.tolist()):
            replies[i] = tok.decode(row[: row.index(end)] if end in row else row)
    return replies


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


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
        write_jsonl(root / "chat.jsonl", records)
    name = "masked" if masked else "unmasked"
    options = ChatOptions(prompt_loss=not masked)
    prepare_chat(
        [root / "chat.jsonl"],
        root / f"ds-{name}",
        tokenizer=str(base),
        block_size=63,
        options=options,
        model_tokenizer=model_tokenizer,
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


def run_lora(root: Path, init: str, steps: int, n_val: int, overrides: list[str], seed: int = 0) -> dict:
    """The real-model variant: English nouns, LoRA (the ``finetune`` recipe), the masked loss."""
    from gptlab.data import prepare_chat
    from gptlab.train import train
    from gptlab.train.config import build_config

    records, held = make_task(seed, n_val=n_val, vocab=NOUNS)
    write_jsonl(root / "chat.jsonl", records)
    prepare_chat(
        [root / "chat.jsonl"],
        root / "ds",
        tokenizer=init,
        block_size=REAL_BLOCK,
        model_tokenizer=model_tokenizer,
    )
    t0 = time.perf_counter()
    before = greedy_replies(init, held)
    score_s = time.perf_counter() - t0
    settings = [
        f"init={init}",
        f"model.block_size={REAL_BLOCK}",
        f"max_steps={steps}",
        f"eval_every={steps}",
        "eval_batches=1",
        f"ckpt_every={steps}",
        "progress=false",
        f"seed={seed}",
        *REAL_SETTINGS,
        *overrides,
    ]
    cfg = build_config("finetune", settings)
    cpu0 = time.process_time()
    result = train(cfg, root / "ds", root / "run")
    train_cpu = time.process_time() - cpu0
    after = greedy_replies(root / "run", held)
    return {
        "init": Path(init).name,
        "finetune": cfg.finetune,
        "lora_rank": cfg.lora_rank,
        "lora_targets": cfg.lora_targets,
        "lr": cfg.lr,
        "batch_size": cfg.batch_size,
        "context": REAL_BLOCK,
        "train_examples": len(records),
        "held_out": len(held),
        "base_exact_match": score(before, held),
        "masked_exact_match": score(after, held),
        "example": {"prompt": held[0][0], "base": before[0], "tuned": after[0]},
        "final_loss": round(result.train_loss or float("nan"), 4),
        "train_wall_s": round(result.train_wall_s, 1),
        "train_cpu_s": round(train_cpu, 1),
        "score_s": round(score_s, 1),
    }


#: the real-model run: rows of 128 tokens (about three conversations each), four rows a step
REAL_BLOCK = 127
REAL_SETTINGS = ["batch_size=4", "lr=5e-3", "threads=2"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="optimizer steps (default 300; 30 with --init)")
    ap.add_argument("--no-compare", action="store_true", help="only the masked run (tiny base)")
    ap.add_argument(
        "--init", help="a pretrained model to fine-tune with LoRA (GGUF file, HF folder, checkpoint)"
    )
    ap.add_argument("--held-out", type=int, default=40, help="held-out prompts of the real task")
    ap.add_argument(
        "--write", metavar="DIR", help="write the real task's train.jsonl and heldout.jsonl, then stop"
    )
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="train settings (with --init)")
    args = ap.parse_args()
    if args.write:
        records, held = make_task(0, n_val=args.held_out, vocab=NOUNS)
        write_jsonl(Path(args.write) / "train.jsonl", records)
        write_jsonl(Path(args.write) / "heldout.jsonl", [{"prompt": p, "answer": a} for p, a in held])
        print(
            json.dumps(
                {"bench": "finetune_chat", "wrote": args.write, "train": len(records), "held_out": len(held)}
            )
        )
        return 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.init:
            steps = args.steps or 30
            out: dict = {"bench": "finetune_chat", "steps": steps}
            out.update(run_lora(Path(tmp), args.init, steps, args.held_out, args.overrides))
        else:
            out = {"bench": "finetune_chat", "steps": args.steps or 300}
            for masked in (True,) if args.no_compare else (True, False):
                out.update(run_task(Path(tmp), masked, args.steps or 300))
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    # the source tree, in place of this script's folder (whose gguf.py would shadow the gguf package)
    sys.path[0] = str(Path(__file__).resolve().parents[1] / "src")
    raise SystemExit(main())
