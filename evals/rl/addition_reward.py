"""The reward of the addition task (``evals/rl/addition.jsonl``: a two-digit plus a one-digit number), for
``objective = "grpo"``:

    train ... reward=evals/rl/addition_reward.py:reward

    r = 1.0   the reply is exactly the sum (spaces and one final "." allowed): what was asked
    r = 0.5   the sum is among the numbers of a longer reply ("27 + 8 = 35"): right, wrong format
    r = 0.0   anything else, a lone wrong number included

The partial credit gives a small model's first samples a signal to follow (a group whose rewards are
all equal teaches nothing). The format alone earns nothing: a credit of 0.2 for a lone wrong number
let SmolLM2-135M's policy collapse within 5 steps onto lone wrong numbers (every group's rewards
equal, nothing left to learn). ``correct`` (the first case) is the accuracy the demonstration reports.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+")


def correct(completion: str, answer: str) -> bool:
    """The reply is the sum alone."""
    return completion.strip().removesuffix(".").strip() == answer


def reward(prompt: str, completion: str, example: dict) -> float:
    answer = str(example["answer"])
    if correct(completion, answer):
        return 1.0
    return 0.5 if answer in NUMBER.findall(completion) else 0.0
