"""Preference pairs for DPO: ``gptlab prepare --format preference``.

Input: JSONL, one pair per line::

    {"prompt": "...", "chosen": "...", "rejected": "..."}
    {"messages": [{"role": "system", ...}, {"role": "user", ...}], "chosen": {...}, "rejected": {...}}

The prompt is a string (one user turn) or chat ``messages`` that end on a user turn; each
answer is a string or an assistant message (``{"role": "assistant", "content": "..."}``, or a
list holding one). The model's chat template (``gptlab.data.chat``) renders the prompt and each
answer as one conversation, and only the answer's tokens count (its end-of-turn token included):

    sequence_w = render(prompt + [chosen]),   mask_w,t = 1 iff token t belongs to the chosen answer
    sequence_l = render(prompt + [rejected]), mask_l,t likewise

so that ``log π(y|x) = Σ_t mask_t·log π(x_t | x_<t)`` (``gptlab.train.preference``).

Files per split (numpy memmaps): ``<split>.bin`` the tokens of every pair's chosen then rejected
sequence, end to end; ``<split>.mask.bin`` (uint8) the answer mask beside them; ``<split>.offsets.bin``
(int64, ``2·pairs + 1``) where each sequence starts. A pair whose sequence is longer than
``block_size + 1`` tokens is truncated at the end (``too_long = truncate``, kept while some of
both answers remain) or dropped. The held-out split is a seeded ``val_fraction`` of the pairs, or,
when the records say ``"split": "train"|"val"`` (every one of them), the split they name: a held-out
set written to test something the training pairs do not contain (``evals/data/preference.jsonl``).
Other keys of a record are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gptlab.data.chat import (
    TOO_LONG,
    BadRecord,
    ChatOptions,
    Messages,
    Renderer,
    fit,
    iter_records,
    prompt_turns,
    renderer,
    segments,
)
from gptlab.data.dataset import (
    DATASET_FORMAT,
    META_FILE,
    TOKENIZER_FILE,
    TokenDataset,
    new_dataset_dir,
    staged_directory,
)
from gptlab.data.sources import PathLike, describe_sources, find_sources
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

if TYPE_CHECKING:
    import torch

    from gptlab.tokenizers.base import Tokenizer

KIND = "preference"

#: (prompt messages, chosen answer, rejected answer)
PreferencePair = tuple[Messages, str, str]
SPLIT_NAMES = ("train", "val")


# ------------------------------------------------------------------ records
def _answer(record: dict[str, Any], key: str) -> str:
    if key not in record:
        raise BadRecord(f'missing "{key}"')
    value = record[key]
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict):
        if value.get("role") != "assistant" or not isinstance(value.get("content"), str):
            raise BadRecord(f'"{key}" as a message must be {{"role": "assistant", "content": "..."}}')
        value = value["content"]
    if not isinstance(value, str):
        raise BadRecord(f'"{key}" must be a string or an assistant message, got {type(value).__name__}')
    if not value.strip():
        raise BadRecord(f'"{key}" is empty')
    return value


def preference_pair(record: Any) -> PreferencePair:
    """``(prompt messages, chosen, rejected)`` of one JSONL record; ``BadRecord`` says what is wrong."""
    if not isinstance(record, dict):
        raise BadRecord(
            'a preference record is an object with "prompt" (or "messages"), "chosen" and "rejected"'
        )
    prompt, chosen, rejected = prompt_turns(record), _answer(record, "chosen"), _answer(record, "rejected")
    if chosen == rejected:
        raise BadRecord('"chosen" and "rejected" are the same answer: nothing to prefer')
    return prompt, chosen, rejected


def _split(record: dict[str, Any]) -> str | None:
    split = record.get("split")
    if split is not None and split not in SPLIT_NAMES:
        raise BadRecord(f'"split" must be "train" or "val", got {split!r}')
    return split


def read_pairs(sources: Sequence[Path], skip_bad: bool) -> tuple[list[PreferencePair], list[str | None], int]:
    """Every valid pair of ``sources``, the split each names (or None), and the number of bad records skipped."""
    pairs: list[PreferencePair] = []
    splits: list[str | None] = []
    bad = 0
    for path in sources:
        for lineno, record in iter_records(path):
            try:
                if isinstance(record, BadRecord):
                    raise record
                pairs.append(preference_pair(record))
                splits.append(_split(record))
            except BadRecord as exc:
                if not skip_bad:
                    raise GptlabError(
                        f"{path}:{lineno}: {exc} (fix it, or pass --skip-bad to skip bad records)"
                    ) from None
                bad += 1
    return pairs, splits, bad


def encode_answer(
    prompt: Messages, answer: str, render: Renderer, tokenizer: Tokenizer
) -> tuple[list[int], list[int]]:
    """``(ids, mask)`` of ``prompt`` + the assistant turn ``answer``: 1 on the answer's tokens only
    (an assistant turn earlier in the prompt does not count)."""
    pieces = segments([*prompt, {"role": "assistant", "content": answer}], render)
    last = max(i for i, (_, is_answer) in enumerate(pieces) if is_answer)
    ids: list[int] = []
    mask: list[int] = []
    for i, (text, _) in enumerate(pieces):
        piece = tokenizer.encode(text, allowed_special="all")
        ids += piece
        mask += [int(i == last)] * len(piece)
    if mask:
        mask[0] = 0  # the first token is never predicted
    return ids, mask


# ------------------------------------------------------------------ prepare
def prepare_preference(
    inputs: Sequence[PathLike],
    out_dir: PathLike,
    tokenizer: str,
    val_fraction: float = 0.1,
    block_size: int = 64,
    progress: bool = False,
    options: ChatOptions | None = None,
    model_tokenizer: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Render, tokenize and mask preference pairs into a dataset directory (see the module docstring)."""
    from gptlab.data.prepare import build_tokenizer, token_dtype

    opt = options or ChatOptions()
    if opt.too_long not in TOO_LONG:
        raise GptlabError(f"too_long must be one of {', '.join(TOO_LONG)}")
    if opt.prompt_loss:
        raise GptlabError("--prompt-loss does not apply to --format preference: only the answers count")
    out = new_dataset_dir(out_dir, val_fraction)
    sources = find_sources(inputs)
    if tokenizer == "char" or tokenizer.startswith("bpe:"):
        raise GptlabError(
            "--format preference needs the model's tokenizer: --tokenizer MODEL (checkpoint, Hugging Face "
            "folder or GGUF file) or a saved tokenizer file"
        )
    tok = build_tokenizer(tokenizer, sources, model_tokenizer)
    render, template = renderer(tok, opt.template)
    pairs, named, bad = read_pairs(sources, opt.skip_bad)
    if len(pairs) < 2:
        raise GptlabError(
            f"{len(pairs)} usable preference pair(s) in {', '.join(map(str, sources))}: need at least 2 "
            f"(one for training, one held out)"
        )
    if any(s is not None for s in named):  # the records name their split
        if None in named or set(named) != set(SPLIT_NAMES):
            raise GptlabError(
                '"split" must be given on every record or on none, with at least one "train" and one "val" pair'
            )
        held = {i for i, s in enumerate(named) if s == "val"}
    else:
        n_val = max(1, round(len(pairs) * val_fraction))
        held = {int(i) for i in np.random.default_rng(0).permutation(len(pairs))[:n_val]}
    length = block_size + 1
    splits: dict[str, dict[str, list[int]]] = {
        s: {"tokens": [], "mask": [], "offsets": [0]} for s in ("train", "val")
    }
    counts = {"pairs": 0, "truncated": 0, "dropped": 0, "skipped_bad": bad}
    nbytes = {"train": 0, "val": 0}
    for i, (prompt, chosen, rejected) in enumerate(pairs):
        encoded = [encode_answer(prompt, answer, render, tok) for answer in (chosen, rejected)]
        fitted = [fit(ids, mask, length, opt.too_long) for ids, mask in encoded]
        kept = [k for k in fitted if k is not None]
        if len(kept) < 2:
            counts["dropped"] += 1
            continue
        counts["truncated"] += any(len(k[0]) < len(e[0]) for k, e in zip(kept, encoded, strict=True))
        counts["pairs"] += 1
        split = splits["val" if i in held else "train"]
        for ids, mask in kept:
            split["tokens"] += ids
            split["mask"] += mask
            split["offsets"].append(len(split["tokens"]))
            nbytes["val" if i in held else "train"] += len(tok.decode_bytes(ids))
    for name, split in splits.items():
        if len(split["offsets"]) == 1:
            raise GptlabError(
                f"no {name} pair fits in --block-size {block_size} (use --too-long truncate, a larger "
                f"--block-size, or more pairs)"
            )
    dtype = token_dtype(tok.vocab_size)
    longest = max(int(np.diff(s["offsets"]).max()) for s in splits.values())
    with staged_directory(out) as stage:
        for name, split in splits.items():
            np.asarray(split["tokens"], dtype=dtype).tofile(stage / f"{name}.bin")
            np.asarray(split["mask"], dtype=np.uint8).tofile(stage / f"{name}.mask.bin")
            np.asarray(split["offsets"], dtype=np.int64).tofile(stage / f"{name}.offsets.bin")
        tok.save(stage / TOKENIZER_FILE)
        meta = {
            "format": DATASET_FORMAT,
            "kind": KIND,
            "data_format": KIND,
            "dtype": dtype.name,
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
            "pad_id": tok.eot_id if tok.eot_id is not None else 0,
            "template": template,
            "loss_on": "answers",
            "too_long": opt.too_long,
            "longest": longest,  # tokens of the longest sequence: the model needs block_size ≥ longest − 1
            **counts,
            "examples": counts["pairs"],
            "documents": counts["pairs"],
            **{f"{s}_pairs": (len(v["offsets"]) - 1) // 2 for s, v in splits.items()},
            **{f"{s}_tokens": len(v["tokens"]) for s, v in splits.items()},
            "train_bytes": max(nbytes["train"], 1),
            "val_bytes": max(nbytes["val"], 1),
            "tokenizer": tokenizer,
            "tokenizer_kind": getattr(tok, "kind", None),
            "val_fraction": val_fraction,
            "split_by": "records" if None not in named else "val_fraction",
            "sources": describe_sources(sources),
        }
        atomic_write_json(stage / META_FILE, meta)
    return meta


# ------------------------------------------------------------------ reading back
class PreferenceDataset(TokenDataset):
    """A directory made by ``prepare_preference``: pairs of (chosen, rejected) sequences per split."""

    def __init__(self, directory: PathLike) -> None:
        super().__init__(directory)
        if self.meta.get("kind") != KIND:
            raise GptlabError(
                f"{self.dir}: not a preference dataset; make one with "
                f"`gptlab prepare --format preference PAIRS.jsonl --tokenizer MODEL`"
            )
        self.pad_id = int(self.meta["pad_id"])
        self._offsets: dict[str, np.ndarray] = {}
        self._masks: dict[str, np.ndarray] = {}

    def pairs(self, split: str) -> int:
        return int(self.meta[f"{split}_pairs"])

    def offsets(self, split: str) -> np.ndarray:
        if split not in self._offsets:
            path = self.dir / f"{split}.offsets.bin"
            n = 2 * self.pairs(split) + 1
            if not path.is_file() or path.stat().st_size != n * 8:
                raise GptlabError(f"{path}: missing or of the wrong size; prepare the dataset again")
            self._offsets[split] = np.memmap(path, dtype=np.int64, mode="r")
            mask = self.dir / f"{split}.mask.bin"
            if not mask.is_file() or mask.stat().st_size != len(self.split(split)):
                raise GptlabError(f"{mask}: missing or not as long as {split}.bin; prepare the dataset again")
            self._masks[split] = np.memmap(mask, dtype=np.uint8, mode="r")
        return self._offsets[split]

    def batch(self, split: str, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of pairs ``index`` (B,): rows ``0..B−1`` the chosen sequences, ``B..2B−1`` the
        rejected ones, each ``(2B, L)`` with L the longest sequence − 1; ``y`` is −1 off the answers."""
        import torch

        offsets, tokens = self.offsets(split), self.split(split)
        mask = self._masks[split]
        rows = [2 * int(i) for i in index] + [2 * int(i) + 1 for i in index]
        width = max(int(offsets[r + 1] - offsets[r]) for r in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        counts = np.zeros((len(rows), width), dtype=bool)
        for j, r in enumerate(rows):
            a, b = int(offsets[r]), int(offsets[r + 1])
            ids[j, : b - a] = tokens[a:b]
            counts[j, : b - a] = mask[a:b] == 1
        x = torch.from_numpy(ids[:, :-1].copy())
        y = torch.from_numpy(np.where(counts[:, 1:], ids[:, 1:], -1))
        return x, y


__all__ = [
    "KIND",
    "PreferenceDataset",
    "encode_answer",
    "preference_pair",
    "prepare_preference",
    "read_pairs",
]
