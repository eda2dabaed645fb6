"""Write ``addition.jsonl``: the verifiable task of gptlab's reinforcement demonstration (bench/grpo_demo.py).

    python evals/rl/make_addition.py            # rewrites evals/rl/addition.jsonl (deterministic, seed 0)

Each record is a chat prompt that ends on a user turn, and the answer a reward function checks::

    {"prompt": "What is 27 + 8? Reply with the number only.", "answer": "35"}

400 distinct sums of a two-digit and a one-digit number (10..99 + 1..9), in a seeded random order.
SmolLM2-135M-Instruct often gets such sums right but answers "27 + 8 = 35", or explains: the
reward (``addition_reward.py``) asks for the number alone, a format the reinforcement can teach.
``gptlab prepare --format prompts`` holds out a share of them (``--val-fraction``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

QUESTION = "What is {a} + {b}? Reply with the number only."
HERE = Path(__file__).resolve().parent


def records(n: int = 400, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < n:
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        if (a, b) not in seen:
            seen.add((a, b))
            pairs.append((a, b))
    return [{"prompt": QUESTION.format(a=a, b=b), "answer": str(a + b)} for a, b in pairs]


def main() -> None:
    out = HERE / "addition.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records()), encoding="utf-8")
    print(f"{out}: {len(records())} prompts")


if __name__ == "__main__":
    main()
