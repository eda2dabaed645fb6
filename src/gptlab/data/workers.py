"""Tokenizing a stream of text pieces with a pool of worker processes, results in input order.

``encode_in_order(pieces, tokenizer_file, dtype, workers)`` yields ``(item, ids)`` for each
``(item, text)`` of ``pieces``, in the order given, whatever the number of workers: piece
``k`` is encoded by whichever worker is free, but results are taken back strictly by ``k``.
Since every piece is encoded alone (the pieces are the same ~1 MB chunks cut at newlines
for any number of workers), the output is byte-identical to one worker's.

Small pieces (JSONL or parquet documents) travel in batches of about ``BATCH_CHARS``
characters, so a corpus of many short documents does not pay one round trip per document.
At most ``4·workers`` batches are in flight, so memory stays flat whatever the corpus size.
Workers are spawned processes that load the tokenizer from its saved JSON file and return
numpy bytes (cheap to pass between processes, unlike a list of ints).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

BATCH_CHARS = 1 << 20
_TOKENIZER: Any = None
_DTYPE: Any = None


def _init(tokenizer_file: str, dtype: str) -> None:
    global _TOKENIZER, _DTYPE
    from gptlab import tokenizers

    _TOKENIZER, _DTYPE = tokenizers.load(tokenizer_file), np.dtype(dtype)


def _encode(texts: list[str]) -> list[bytes]:
    return [np.asarray(_TOKENIZER.encode(text), dtype=_DTYPE).tobytes() for text in texts]


def _batches(pieces: Iterable[tuple[Any, str]]) -> Iterator[list[tuple[Any, str]]]:
    batch: list[tuple[Any, str]] = []
    size = 0
    for item, text in pieces:
        batch.append((item, text))
        size += len(text)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_in_order(
    pieces: Iterable[tuple[Any, str]], tokenizer: Any, tokenizer_file: Path, dtype: np.dtype, workers: int
) -> Iterator[tuple[Any, np.ndarray]]:
    """``(item, ids)`` per ``(item, text)``, in order; ``workers = 1`` encodes in this process."""
    if workers <= 1:
        for item, text in pieces:
            yield item, np.asarray(tokenizer.encode(text), dtype=dtype)
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    with ctx.Pool(workers, initializer=_init, initargs=(str(tokenizer_file), dtype.name)) as pool:
        pending: deque[tuple[list[Any], Any]] = deque()
        for batch in _batches(pieces):
            texts = [text for _, text in batch]
            pending.append(([item for item, _ in batch], pool.apply_async(_encode, (texts,))))
            if len(pending) >= 4 * workers:
                yield from _take(pending.popleft(), dtype)
        while pending:
            yield from _take(pending.popleft(), dtype)


def _take(done: tuple[list[Any], Any], dtype: np.dtype) -> Iterator[tuple[Any, np.ndarray]]:
    items, result = done
    for item, ids in zip(items, result.get()):
        yield item, np.frombuffer(ids, dtype=dtype)
