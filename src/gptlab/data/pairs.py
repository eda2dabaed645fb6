"""Source–target pairs for an encoder–decoder: ``gptlab prepare --format pairs``.

Input: JSONL, one ``{"source": "...", "target": "..."}`` per line. Each pair becomes

    source row   x = T(source)                                  right-padded to S
    target row   y = [BOS] + T(target) + [EOS]                  right-padded to T_y

with ``<|endoftext|>`` as both BOS and EOS. The decoder reads ``y[:-1]`` and is trained
to predict ``y[1:]``; padding positions get the target −1, so the loss
``L = −Σ_t log P(y_t | y_<t, x)`` is taken over target tokens only. Rows are stored
as fixed-width numpy memmaps (``train.src.bin``, ``train.tgt.bin``, ``val.*``) with
the padding id ``pad_id = vocab_size``; the last ``val_fraction`` of the pairs is the
validation split. ``toy_pairs`` writes the string tasks the ``seq2seq-toy`` recipe learns.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gptlab.data.dataset import (
    DATASET_FORMAT,
    EOT,
    META_FILE,
    TOKENIZER_FILE,
    TokenDataset,
    new_dataset_dir,
    staged_directory,
)
from gptlab.data.prepare import ModelTokenizer, build_tokenizer, token_dtype
from gptlab.data.sources import PathLike, describe_sources, find_sources
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

KIND = "pairs"
Pair = tuple[str, str]


def read_pairs(path: Path) -> list[Pair]:
    """``[(source, target)]`` from a JSONL file; a bad line is an error naming it."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                pair = (row["source"], row["target"])
            except (ValueError, KeyError, TypeError):
                raise GptlabError(
                    f'{path}:{n}: expected a JSON object with "source" and "target" strings'
                ) from None
            if not all(isinstance(s, str) for s in pair):
                raise GptlabError(f'{path}:{n}: "source" and "target" must be strings')
            pairs.append(pair)
    return pairs


def _tokenizer(
    spec: str, pairs: Sequence[Pair], sources: Sequence[Path], model_tokenizer: ModelTokenizer | None
) -> Any:
    """``char``: the pairs' characters + ``<|endoftext|>``; else as ``build_tokenizer`` (which must have it)."""
    from gptlab import tokenizers

    if spec == "char":
        chars = sorted({c for pair in pairs for text in pair for c in text})
        return tokenizers.CharTokenizer(chars, special_tokens={EOT: len(chars)})
    tok = build_tokenizer(spec, sources, model_tokenizer)
    if tok.eot_id is None:
        raise GptlabError(f"--tokenizer {spec!r} has no {EOT}, which pairs use to begin and end targets")
    return tok


def prepare_pairs(
    inputs: Sequence[PathLike],
    out_dir: PathLike,
    tokenizer: str = "char",
    val_fraction: float = 0.1,
    block_size: int = 64,
    progress: bool = False,
    model_tokenizer: ModelTokenizer | None = None,
) -> dict[str, Any]:
    """Tokenize JSONL pairs into ``out_dir`` (``{train,val}.{src,tgt}.bin``, tokenizer.json, meta.json)."""
    out = new_dataset_dir(out_dir, val_fraction)
    sources = find_sources(inputs)
    pairs = [p for path in sources for p in read_pairs(path)]
    n_val = int(len(pairs) * val_fraction)
    if n_val < 1 or len(pairs) - n_val < 1:
        raise GptlabError(f"{len(pairs)} pair(s): too few for a train and a val split; give more pairs")
    tok = _tokenizer(tokenizer, pairs, sources, model_tokenizer)
    eot = tok.eot_id
    src = [tok.encode(s) for s, _ in pairs]
    tgt = [[eot, *tok.encode(t), eot] for _, t in pairs]
    S, T = max(map(len, src)), max(map(len, tgt))
    if max(S, T - 1) > block_size:
        raise GptlabError(
            f"the longest source has {S} tokens and the longest target {T - 1} (with its BOS): more than "
            f"--block-size {block_size}; raise it (and model.block_size) or shorten the pairs"
        )
    if min(map(len, src)) == 0:
        raise GptlabError("a pair has an empty source; every source needs at least one token")
    pad = tok.vocab_size
    dtype = token_dtype(pad + 1)
    split_at = len(pairs) - n_val
    meta: dict[str, Any] = {
        "format": DATASET_FORMAT,
        "kind": KIND,
        "dtype": dtype.name,
        "vocab_size": tok.vocab_size,
        "eot_id": eot,
        "pad_id": pad,
        "source_len": S,
        "target_len": T,
        "tokenizer": tokenizer,
        "tokenizer_kind": getattr(tok, "kind", None),
        "val_fraction": val_fraction,
        "sources": describe_sources(sources),
        "documents": len(pairs),
    }
    with staged_directory(out) as stage:
        for split, rows in (("train", slice(0, split_at)), ("val", slice(split_at, None))):
            _padded(src[rows], S, pad, dtype).tofile(stage / f"{split}.src.bin")
            _padded(tgt[rows], T, pad, dtype).tofile(stage / f"{split}.tgt.bin")
            meta[f"{split}_pairs"] = len(src[rows])
            meta[f"{split}_tokens"] = sum(len(t) - 1 for t in tgt[rows])  # predicted target tokens
            meta[f"{split}_bytes"] = sum(len(t.encode("utf-8")) + 1 for _, t in pairs[rows])
        tok.save(stage / TOKENIZER_FILE)
        atomic_write_json(stage / META_FILE, meta)
    return meta


def _padded(rows: Sequence[list[int]], width: int, pad: int, dtype: np.dtype) -> np.ndarray:
    out = np.full((len(rows), width), pad, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


class PairDataset(TokenDataset):
    """A directory made by ``prepare_pairs``: ``rows(split) -> (sources (N, S), targets (N, T_y))``."""

    def __init__(self, directory: PathLike) -> None:
        super().__init__(directory)
        if self.meta.get("kind") != KIND:
            raise GptlabError(
                f"{self.dir}: not a pairs dataset; make one with `gptlab prepare --format pairs FILE.jsonl`"
            )
        self.pad_id = int(self.meta["pad_id"])
        self._rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def rows(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in self._rows:
            n = int(self.meta[f"{split}_pairs"])
            widths = (int(self.meta["source_len"]), int(self.meta["target_len"]))
            arrays = []
            for side, width in zip(("src", "tgt"), widths, strict=True):
                path = self.dir / f"{split}.{side}.bin"
                if not path.is_file() or path.stat().st_size != n * width * self.dtype.itemsize:
                    raise GptlabError(f"{path}: missing or of the wrong size; prepare the dataset again")
                arrays.append(np.memmap(path, dtype=self.dtype, mode="r").reshape(n, width))
            self._rows[split] = (arrays[0], arrays[1])
        return self._rows[split]

    def batch(self, split: str, index: np.ndarray) -> tuple[Any, ...]:
        """``(source, source_mask, target_in, target_out)`` of rows ``index``, trimmed to their longest."""
        import torch

        src_rows, tgt_rows = self.rows(split)
        src = torch.from_numpy(src_rows[index].astype(np.int64))
        tgt = torch.from_numpy(tgt_rows[index].astype(np.int64))
        src_mask = src != self.pad_id
        tgt_mask = tgt != self.pad_id
        src = src[:, : int(src_mask.sum(1).max())]
        src_mask = src_mask[:, : src.size(1)]
        width = int(tgt_mask.sum(1).max())
        tgt, tgt_mask = tgt[:, :width], tgt_mask[:, :width]
        src = src.masked_fill(~src_mask, 0)
        target_out = tgt[:, 1:].masked_fill(~tgt_mask[:, 1:], -1)  # loss on target tokens only
        return src, src_mask, tgt[:, :-1].masked_fill(~tgt_mask[:, :-1], 0), target_out


def pair_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch ``epoch`` visits ``n`` pairs: a function of ``(seed, epoch)`` only."""
    return np.random.default_rng([seed, epoch]).permutation(n)


# --------------------------------------------------------------- toy tasks
TOY_TASKS = {
    "reverse": lambda s: s[::-1],
    "sort": lambda s: "".join(sorted(s)),
}


def toy_pairs(
    task: str, n: int, seed: int = 0, min_len: int = 3, max_len: int = 10, alphabet: str = "abcdefghijklmnop"
) -> list[dict[str, str]]:
    """``n`` distinct random strings and their ``task`` (reverse | sort) as ``{"source", "target"}`` rows."""
    if task not in TOY_TASKS:
        raise GptlabError(f"unknown toy task {task!r}; choose one of {', '.join(TOY_TASKS)}")
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[dict[str, str]] = []
    while len(rows) < n:
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(min_len, max_len)))
        if s not in seen:
            seen.add(s)
            rows.append({"source": s, "target": TOY_TASKS[task](s)})
    return rows
