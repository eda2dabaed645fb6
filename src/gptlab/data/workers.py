"""Tokenizing a corpus's pieces with a pool of worker processes, results in input order.

``TokenizerPool(tok, dtype, workers).encode(pieces)`` yields one ``Encoded`` per piece
(``pieces.py``), in the order given, whatever the number of workers: piece ``k`` is read and
encoded by whichever worker is free, but results are taken back strictly by ``k``. Every piece
is encoded alone, and the pieces do not depend on the number of workers, so the output is
byte-identical to one worker's.

The preparing process does almost nothing per piece: it sends a ``(file, block)`` descriptor
(a few dozen bytes, not the text), and gets back the token ids as bytes. Each worker reads its
own bytes from the file, decodes, checks and encodes them. With a tiktoken back-end the ids
come from ``encode_to_numpy`` (no list of Python ints on the way). At most ``2·workers``
pieces are in flight, so memory stays flat whatever the corpus size.

On Linux the workers are forked from the preparing process once the tokenizer is built (they
start in milliseconds and share its tables; each builds its own tiktoken encoder when it first
encodes, and the parent has run no threads of its own yet). Elsewhere they are spawned and load
the tokenizer from its saved file.
"""

from __future__ import annotations

import sys
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from gptlab.data.dataset import EOT
from gptlab.data.pieces import Piece, piece_bytes, read_piece
from gptlab.tokenizers.base import check_text
from gptlab.tokenizers.ranked import RankedTokenizer

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

FORK = sys.platform.startswith("linux")  # fork is safe here: workers only run numpy and the tokenizer
IN_FLIGHT = 2  # pieces in flight per worker
_PARENT: Any = None  # (tokenizer, dtype) handed to forked workers
_JOB: Any = None  # the worker's encoder


class Encoded(NamedTuple):
    """One piece, tokenized: ``ids`` holds each document's tokens, preceded by ``<|endoftext|>`` when the
    document starts in this piece and the tokenizer has that token."""

    ids: np.ndarray
    documents: int  # documents that start in the piece
    text_bytes: int  # UTF-8 bytes of its text, counting one separator per document that starts here
    source_bytes: int  # bytes of the source it stands for (progress)


def array_encoder(tok: Tokenizer, dtype: np.dtype) -> Callable[[str], np.ndarray]:
    """``text → ids`` as an array of ``dtype``: ``tok.encode(text)`` (ordinary text, no special tokens).

    With the tiktoken back-end the ids come from ``encode_to_numpy`` (the same ids, without a list
    of Python ints, faster than ``encode`` + ``np.asarray``: docs/benchmarks.md#data-preparation).
    """
    if isinstance(tok, RankedTokenizer) and tok.backend == "tiktoken":
        encoding = tok._encoding  # built by the ``backend`` property just above

        def encode(text: str) -> np.ndarray:
            return encoding.encode_to_numpy(check_text(text), disallowed_special=()).astype(dtype, copy=False)

        return encode
    return lambda text: np.asarray(tok.encode(text), dtype=dtype)


class PieceEncoder:
    """Read and encode one piece (in a worker, or in the preparing process with one worker)."""

    def __init__(self, tok: Tokenizer, dtype: np.dtype) -> None:
        self.encode = array_encoder(tok, dtype)
        self.eot = None if tok.eot_id is None else np.asarray([tok.eot_id], dtype=dtype)
        self.eot_bytes = 0 if self.eot is None else len(EOT.encode("utf-8"))
        self.dtype = dtype

    def __call__(self, piece: Piece) -> Encoded:
        parts, docs, nbytes = [], 0, 0
        for starts, text, size in read_piece(piece):
            if starts:
                docs += 1
                if self.eot is not None:
                    parts.append(self.eot)
                    nbytes += self.eot_bytes
            parts.append(self.encode(text))
            nbytes += size
        ids = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, self.dtype)
        return Encoded(ids, docs, nbytes, piece_bytes(piece))


def _init(tokenizer_file: str | None, dtype: str) -> None:
    global _JOB
    if tokenizer_file is None:  # forked: the parent's tokenizer
        tok, dt = _PARENT
    else:  # spawned: load it from its file
        from gptlab import tokenizers

        tok, dt = tokenizers.load(tokenizer_file), np.dtype(dtype)
    _JOB = PieceEncoder(tok, dt)


def _work(piece: Piece) -> tuple[bytes, int, int, int]:
    ids, docs, nbytes, source = _JOB(piece)
    return ids.tobytes(), docs, nbytes, source


class TokenizerPool:
    """``workers`` processes that encode pieces, results in order (``workers = 1``: this process).

    Use as a context manager. Where workers are spawned (not on Linux, where they are forked) the
    tokenizer is saved to ``tokenizer_file`` first, for them to load.
    """

    def __init__(self, tok: Tokenizer, dtype: np.dtype, workers: int, tokenizer_file: Path) -> None:
        self.tok, self.dtype, self.workers, self.file = tok, dtype, workers, tokenizer_file
        self.pool: Any = None

    def __enter__(self) -> TokenizerPool:
        global _PARENT
        if self.workers <= 1:
            return self
        import multiprocessing

        ctx = multiprocessing.get_context("fork" if FORK else "spawn")
        if not FORK and not self.file.exists():
            self.tok.save(self.file)  # spawned workers load it
        initargs = (None if FORK else str(self.file), self.dtype.name)
        _PARENT = (self.tok, self.dtype)  # kept while the pool lives, should it fork a worker again
        with warnings.catch_warnings():  # Python ≥ 3.12 warns on fork with threads (numpy's idle BLAS pool)
            warnings.simplefilter("ignore", DeprecationWarning)
            self.pool = ctx.Pool(self.workers, initializer=_init, initargs=initargs)
        return self

    def __exit__(self, *exc: object) -> None:
        global _PARENT
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
        _PARENT = None

    def encode(self, pieces: Iterable[Piece]) -> Iterator[Encoded]:
        """``Encoded`` per piece, in order."""
        if self.pool is None:
            job = PieceEncoder(self.tok, self.dtype)
            for piece in pieces:
                yield job(piece)
            return
        pending: deque[Any] = deque()
        for piece in pieces:
            pending.append(self.pool.apply_async(_work, (piece,)))
            if len(pending) >= IN_FLIGHT * self.workers:
                yield self._take(pending.popleft())
        while pending:
            yield self._take(pending.popleft())

    def _take(self, result: Any) -> Encoded:
        ids, docs, nbytes, source = result.get()
        return Encoded(np.frombuffer(ids, dtype=self.dtype), docs, nbytes, source)
