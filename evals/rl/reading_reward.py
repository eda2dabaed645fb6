"""The reward of the reading task (``evals/rl/reading.jsonl``: two counts in a sentence, a question on one of
them, "Reply with the number only"), for ``objective = "grpo"``:

    train ... reward=evals/rl/reading_reward.py:reward

    r = 1.0   the reply is exactly the asked count (spaces and one final "." allowed): what was asked
    r = 0.3   the asked count is the first number of a longer reply ("Mia has 8 cups."): right, wrong format
    r = 0.0   anything else: the other count, alone or not, included

No credit goes to the format alone: a lone wrong number earns nothing (a partial credit for it let the
policy collapse onto lone wrong numbers, all rewards equal, nothing left to learn). ``correct`` (the first
case) is the accuracy the demonstration reports.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"\d+")


def correct(completion: str, answer: str) -> bool:
    """The reply is the asked count alone."""
    return completion.strip().removesuffix(".").strip() == answer


def reward(prompt: str, completion: str, example: dict) -> float:
    answer = str(example["answer"])
    if correct(completion, answer):
        return 1.0
    numbers = NUMBER.findall(completion)
    return 0.3 if numbers and numbers[0] == answer else 0.0
