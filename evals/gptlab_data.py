"""The offline data of gptlab's own lm-eval tasks: JSONL files beside this module, read without a network.

Each task YAML names a loader here (``custom_dataset: !function gptlab_data.choice``); lm-eval calls it
with the task's ``metadata`` and ``dataset_kwargs`` and gets a ``DatasetDict`` with a ``test`` split.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets

DATA = Path(__file__).resolve().parent / "data"


def _split(name: str) -> datasets.DatasetDict:
    with (DATA / f"{name}.jsonl").open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def choice(**_: object) -> datasets.DatasetDict:
    """Multiple choice: ``{"question", "choices": [4 strings], "answer": index}``."""
    return _split("choice")


def rolling(**_: object) -> datasets.DatasetDict:
    """Paragraphs for rolling perplexity: ``{"text"}``."""
    return _split("rolling")


def gen(**_: object) -> datasets.DatasetDict:
    """Sentences to complete: ``{"prompt", "answer"}``."""
    return _split("gen")
