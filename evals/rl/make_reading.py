"""Write ``reading.jsonl``: the verifiable task of gptlab's reinforcement demonstration (bench/grpo_demo.py).

    python evals/rl/make_reading.py            # rewrites evals/rl/reading.jsonl (deterministic, seed 0)

Each record is a chat prompt that ends on a user turn, and the answer a reward function checks::

    {"prompt": "Mia has 27 pens and 8 cups. How many cups does Mia have? Reply with the number only.",
     "answer": "8"}

A sentence names two counts of two different things; the question asks for one of them (either, at
random), and the reply must be that number alone (``reading_reward.py:correct``). The answer is in
the prompt: what is checked is reading the right count and the format. SmolLM2-135M-Instruct mostly
answers with a sentence ("Mia has 8 cups.") or picks the other count; the reinforcement teaches both
from the reward. ``gptlab prepare --format prompts`` holds out a share of them (``--val-fraction``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Mia", "Tom", "Ana", "Leo", "Sara", "Omar", "Lena", "Ben", "Yuki", "Ravi", "Emma", "Paul"]
THINGS = ["pens", "cups", "books", "apples", "coins", "stamps", "shells", "cards", "keys", "marbles"]
QUESTION = "{name} has {n1} {t1} and {n2} {t2}. How many {ask} does {name} have? Reply with the number only."
HERE = Path(__file__).resolve().parent


def records(n: int = 400, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    seen: set[str] = set()
    while len(out) < n:
        name = rng.choice(NAMES)
        t1, t2 = rng.sample(THINGS, 2)
        n1, n2 = rng.sample(range(2, 100), 2)
        first = rng.random() < 0.5
        prompt = QUESTION.format(name=name, n1=n1, t1=t1, n2=n2, t2=t2, ask=t1 if first else t2)
        if prompt not in seen:
            seen.add(prompt)
            out.append({"prompt": prompt, "answer": str(n1 if first else n2)})
    return out


def main() -> None:
    out = HERE / "reading.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records()), encoding="utf-8")
    print(f"{out}: {len(records())} prompts")


if __name__ == "__main__":
    main()
