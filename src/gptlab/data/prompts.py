"""Prompts for reinforcement from a reward: ``gptlab prepare --format prompts``.

Input: JSONL (or a JSON array), one record per line, each either

* ``{"prompt": "What is 12+30?"}``: one user turn, or
* ``{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}`` ending on a
  ``user`` turn (OpenAI's chat format; earlier turns are kept as the conversation so far).

Any other field of a record (``"answer": "42"``, an id, a test case) is kept and handed back with
the prompt, so a reward function can check a completion against it (``gptlab.train.reinforce``).

Each prompt is rendered with the model's chat template (or ``--template``) with the assistant
turn opened (the generation prompt: ``<|im_start|>assistant\\n`` for ChatML), then tokenized::

    x = T(render(messages, add_generation_prompt=True))        the ids the policy continues

A prompt of more than ``--block-size`` tokens is dropped (and counted); a bad record is one
``GptlabError`` naming its file and line (``--skip-bad`` skips and counts them). A seeded
shuffle (seed 0) puts ``⌈n·val_fraction⌉`` prompts (at least 1) in the held-out ``val`` split.
On disk, per split::

    <split>.bin          the prompts' token ids, one after another (the dataset's dtype)
    <split>.offsets.bin  uint64, n + 1 offsets: prompt i is ids[offsets[i]:offsets[i + 1]]
    <split>.jsonl        one line per prompt: {"prompt": the user's text, "example": the record}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gptlab.data.chat import BadRecord, Messages, iter_records, prompt_turns, renderer
from gptlab.data.dataset import (
    DATASET_FORMAT,
    META_FILE,
    SPLITS,
    TOKENIZER_FILE,
    TokenDataset,
    new_dataset_dir,
    staged_directory,
)
from gptlab.data.sources import PathLike, describe_sources, find_sources
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

KIND = "prompts"


def prompt_messages(record: Any) -> tuple[Messages, str]:
    """``(messages, the user's last text)`` of one record (``chat.prompt_turns``); a bad one raises ``BadRecord``."""
    turns = prompt_turns(record)
    return turns, turns[-1]["content"]


def encode_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids of a rendered prompt; the template writes its own BOS, so the tokenizer's is dropped."""
    ids = list(tokenizer.encode(text, allowed_special="all"))
    if getattr(tokenizer, "add_bos", False) and getattr(tokenizer, "bos_id", None) is not None and ids:
        return ids[1:]
    return ids


def prepare_prompts(
    inputs: Sequence[PathLike],
    out_dir: PathLike,
    tokenizer: str,
    val_fraction: float = 0.1,
    block_size: int = 64,
    progress: bool = False,
    template: str = "auto",
    skip_bad: bool = False,
    model_tokenizer: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Render and tokenize the prompts of ``inputs`` into a prompts dataset directory (``PromptDataset``)."""
    from gptlab.data.prepare import build_tokenizer, token_dtype

    out = new_dataset_dir(out_dir, val_fraction)
    sources = find_sources(inputs)
    if tokenizer == "char" or tokenizer.startswith("bpe:"):
        raise GptlabError(
            "--format prompts needs the model's tokenizer: --tokenizer MODEL (checkpoint, Hugging Face "
            "folder or GGUF file) or a saved tokenizer file"
        )
    tok = build_tokenizer(tokenizer, sources, model_tokenizer)
    render, template_name = renderer(tok, template)
    rows: list[tuple[list[int], str, dict[str, Any]]] = []
    bad = dropped = 0
    for path in sources:
        for lineno, record in iter_records(path):
            try:
                if isinstance(record, BadRecord):
                    raise record
                messages, text = prompt_messages(record)
            except BadRecord as exc:
                if not skip_bad:
                    raise GptlabError(
                        f"{path}:{lineno}: {exc} (fix it, or pass --skip-bad to skip bad records)"
                    ) from None
                bad += 1
                continue
            ids = encode_prompt_ids(tok, render(messages, True))
            if len(ids) > block_size:
                dropped += 1
                continue
            rows.append((ids, text, record))
    if len(rows) < 2:
        raise GptlabError(
            f"{len(rows)} usable prompt(s) in {', '.join(map(str, sources))} ({dropped} longer than "
            f"--block-size {block_size}, {bad} bad): need at least 2, one for training, one held out"
        )
    order = np.random.default_rng(0).permutation(len(rows))
    n_val = min(len(rows) - 1, max(1, int(np.ceil(len(rows) * val_fraction))))
    split_rows = {
        "val": [rows[i] for i in sorted(order[:n_val])],
        "train": [rows[i] for i in sorted(order[n_val:])],
    }
    dtype = token_dtype(tok.vocab_size)
    meta: dict[str, Any] = {
        "format": DATASET_FORMAT,
        "kind": KIND,
        "data_format": "prompts",
        "dtype": dtype.name,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "template": template_name,
        "block_size": block_size,
        "longest_prompt": max(len(ids) for ids, _, _ in rows),
        "examples": len(rows),
        "documents": len(rows),
        "dropped": dropped,
        "skipped_bad": bad,
        "tokenizer": tokenizer,
        "tokenizer_kind": getattr(tok, "kind", None),
        "val_fraction": val_fraction,
        "sources": describe_sources(sources),
    }
    with staged_directory(out) as stage:
        for split, chosen in split_rows.items():
            lengths = [len(ids) for ids, _, _ in chosen]
            np.asarray([i for ids, _, _ in chosen for i in ids], dtype=dtype).tofile(stage / f"{split}.bin")
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint64).tofile(stage / f"{split}.offsets.bin")
            with open(stage / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for _, text, record in chosen:
                    f.write(json.dumps({"prompt": text, "example": record}, ensure_ascii=False) + "\n")
            meta[f"{split}_prompts"] = len(chosen)
            meta[f"{split}_tokens"] = sum(lengths)
            meta[f"{split}_bytes"] = max(1, sum(len(text.encode("utf-8")) for _, text, _ in chosen))
        tok.save(stage / TOKENIZER_FILE)
        atomic_write_json(stage / META_FILE, meta)
    return meta


class PromptDataset(TokenDataset):
    """A directory made by ``prepare_prompts``: per split, the prompts' ids and their records."""

    def __init__(self, directory: PathLike) -> None:
        super().__init__(directory)
        if self.meta.get("kind") != KIND:
            raise GptlabError(
                f"{self.dir}: not a prompts dataset; make one with "
                f"`gptlab prepare --format prompts FILE.jsonl --tokenizer MODEL`"
            )
        self._offsets: dict[str, np.ndarray] = {}
        self._records: dict[str, list[tuple[str, dict[str, Any]]]] = {}

    def count(self, split: str) -> int:
        """Prompts in ``split``."""
        return int(self.meta[f"{split}_prompts"])

    def offsets(self, split: str) -> np.ndarray:
        if split not in self._offsets:
            if split not in SPLITS:
                raise GptlabError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
            path = self.dir / f"{split}.offsets.bin"
            offsets = np.fromfile(path, dtype=np.uint64) if path.is_file() else np.zeros(0, np.uint64)
            if len(offsets) != self.count(split) + 1 or int(offsets[-1]) != len(self.split(split)):
                raise GptlabError(f"{path}: missing or not matching {split}.bin; prepare the dataset again")
            self._offsets[split] = offsets
        return self._offsets[split]

    def prompt_ids(self, split: str, i: int) -> list[int]:
        """The token ids of prompt ``i`` of ``split`` (rendered, the assistant turn opened)."""
        o = self.offsets(split)
        return [int(t) for t in self.split(split)[int(o[i]) : int(o[i + 1])]]

    def record(self, split: str, i: int) -> tuple[str, dict[str, Any]]:
        """``(the user's text, the whole record)`` of prompt ``i`` of ``split``."""
        if split not in self._records:
            path = self.dir / f"{split}.jsonl"
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
                rows = [json.loads(line) for line in lines]
                self._records[split] = [(r["prompt"], r["example"]) for r in rows]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise GptlabError(f"{path}: unreadable ({exc}); prepare the dataset again") from None
            if len(self._records[split]) != self.count(split):
                raise GptlabError(f"{path}: not one line per prompt; prepare the dataset again")
        return self._records[split][i]

    def longest(self) -> int:
        """Tokens of the longest prompt of either split."""
        return max(int(np.diff(self.offsets(s).astype(np.int64)).max()) for s in SPLITS)


__all__ = ["KIND", "PromptDataset", "encode_prompt_ids", "prepare_prompts", "prompt_messages"]
