"""``evals/data/choice_train.jsonl``, the fine-tuning split of the README's before/after, is not the evaluation:
no question of ``gptlab_choice`` and no subject of ``gptlab_gen`` appears in it."""

from __future__ import annotations

import json
import re

from tests import ROOT

DATA = ROOT / "evals" / "data"


def rows(name: str) -> list[dict]:
    return [
        json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9-]+", text.lower()))


def test_the_train_split_is_disjoint_from_the_evaluation_items():
    train = rows("choice_train.jsonl")
    assert len(train) >= 50 and all(set(r) == {"text"} for r in train)
    questions = [norm(r["text"].split("\n")[0].removeprefix("Question:")) for r in train]
    assert len(set(questions)) == len(questions)
    texts = [norm(r["text"]) for r in train]
    for item in rows("choice.jsonl"):
        assert norm(item["question"]) not in questions
    for item in rows("gen.jsonl"):  # "The capital of Egypt is" → "capital of egypt"
        subject = norm(item["prompt"]).removeprefix("the ").rsplit(" ", 1)[0]
        assert not any(subject in text for text in texts), subject
