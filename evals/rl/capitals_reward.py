"""The reward of the capitals task (``evals/rl/capitals.jsonl``: "What is the capital of X? Reply with the
city name only."), for ``objective = "grpo"``:

    train ... reward=evals/rl/capitals_reward.py:reward

    r = 1.0                 the reply is the capital alone (case, accents, spaces and one final "." aside)
    r = 0.5 · 4 / (4 + w)   the capital is named inside a longer reply of w words: right, wrong format,
                            worth more the shorter the reply ("Lima, Peru." > "The capital of Peru is Lima.")
    r = 0.0                 anything else: a wrong city, alone or not, earns nothing

No credit goes to the format alone (a lone wrong answer earning something lets the policy collapse onto
lone wrong answers). ``correct`` (the first case) is the accuracy the demonstration reports.
"""

from __future__ import annotations

import re
import unicodedata


def _plain(text: str) -> str:
    """Lower case, accents dropped, runs of spaces one space, outer spaces and final punctuation gone."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    return re.sub(r"\s+", " ", text).strip().rstrip(".!").strip()


def _names(answer: str) -> list[str]:
    return [_plain(a) for a in answer.split("|")]


def correct(completion: str, answer: str) -> bool:
    """The reply is the capital alone (any of its spellings)."""
    return _plain(completion) in _names(answer)


def reward(prompt: str, completion: str, example: dict) -> float:
    answer = str(example["answer"])
    if correct(completion, answer):
        return 1.0
    text = _plain(completion)
    if any(re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) for name in _names(answer)):
        return 0.5 * 4 / (4 + len(text.split()))
    return 0.0
