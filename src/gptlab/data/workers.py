"""Tokenizing a stream of text pieces with a pool of worker processes, results in input order.

``encode_in_order(pieces, tokenizer_file, dtype, workers)`` yields ``(item, ids)`` for each
``(item, text)`` of ``pieces``, in the order given, whatever the number of workers: piece
``k`` is encoded by whichever worker is free, but results are taken back strictly by ``k``.
Since every piece is encoded alone (the pieces are the same ~1 MB chunks cut at newlines
for any number of workers), the output is byte-identical to one worker's.

At most ``4·workers`` pieces are in flight, so memory stays flat whatever the corpus size.
Workers are spawned processes that load the tokenizer from its saved JSON file and return
numpy bytes (cheap to pass between processes, unlike a list of ints).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

_TOKENIZER: Any = None
_DTYPE: Any = None


def _init(tokenizer_file: str, dtype: str) -> None:
    global _TOKENIZER, _DTYPE
    from gptlab import tokenizers

    _TOKENIZER, _DTYPE = tokenizers.load(tokenizer_file), np.dtype(dtype)


def _encode(text: str) -> bytes:
    return np.asarray(_TOKENIZER.encode(text), dtype=_DTYPE).tobytes()


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
        pending: deque[tuple[Any, Any]] = deque()
        for item, text in pieces:
            pending.append((item, pool.apply_async(_encode, (text,))))
            if len(pending) >= 4 * workers:
                done_item, result = pending.popleft()
                yield done_item, np.frombuffer(result.get(), dtype=dtype)
        while pending:
            done_item, result = pending.popleft()
            yield done_item, np.frombuffer(result.get(), dtype=dtype)
