"""Write ``addition.jsonl``: the verifiable task of gptlab's reinforcement demonstration (bench/grpo_demo.py).

    python evals/rl/make_addition.py            # rewrites evals/rl/addition.jsonl (deterministic, seed 0)

Each record is a chat prompt that ends on a user turn, and the answer a reward function checks::

    {"messages": [{"role": "system", "content": "You are a calculator. Reply with the number only."},
                  {"role": "user", "content": "27 + 82"}], "answer": "109"}

400 distinct sums of two two-digit numbers (10..99), in a seeded random order. The short system
turn replaces the model's default one, so the prompts stay short (about 30 tokens for SmolLM2).
``gptlab prepare --format prompts`` holds out a share of them (``--val-fraction``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM = "You are a calculator. Reply with the number only."
HERE = Path(__file__).resolve().parent


def records(n: int = 400, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if (a, b) not in seen:
            seen.add((a, b))
            pairs.append((a, b))
    return [
        {
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{a} + {b}"}],
            "answer": str(a + b),
        }
        for a, b in pairs
    ]


def main() -> None:
    out = HERE / "addition.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records()), encoding="utf-8")
    print(f"{out}: {len(records())} prompts")


if __name__ == "__main__":
    main()
