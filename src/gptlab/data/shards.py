"""Token shards: a split stored as numbered files ``train-00000.bin``, ``train-00001.bin``, … of at most
``M`` tokens each, written as a stream and read back as one array.

``ShardWriter`` appends token ids and starts a new file every ``M`` tokens (``M = 0``: one file,
``train.bin``, the single-file layout). ``ShardedTokens`` reads the files as memmaps and
indexes them like one 1-D array: global token ``i`` is token ``i − b_s`` of shard ``s`` where
``b_s ≤ i < b_{s+1}`` (``b`` the cumulative token counts), so a training window may straddle
two shards and the sampler's sample ``g`` → window mapping does not depend on the sharding.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from gptlab.errors import GptlabError

COPY_TOKENS = 1 << 22  # tokens moved at a time when a split is re-cut
MARK_TOKENS = 1 << 20  # a copy of a shard's hash state is kept every this many tokens


def shard_name(split: str, index: int, shard_tokens: int) -> str:
    """``train-00003.bin``; ``train.bin`` when unsharded (``shard_tokens = 0``)."""
    return f"{split}-{index:05d}.bin" if shard_tokens else f"{split}.bin"


class ShardWriter:
    """Append token ids (numpy arrays) to ``split-NNNNN.bin`` files of at most ``shard_tokens`` tokens.

    Each file's sha256 is computed as it is written (no second pass over the files). Every
    ``MARK_TOKENS`` tokens a copy of the hash state is kept, so ``truncate(n)`` re-hashes only the
    bytes between the last mark and the cut.
    """

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int = 0) -> None:
        self.dir, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.files: list[Path] = []
        self.counts: list[int] = []
        self.hashes: list[Any] = []
        self.marks: list[list[tuple[int, Any]]] = []  # per file: (tokens written, hash state then)
        self._f: Any = None

    def write(self, ids: np.ndarray) -> None:
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        while len(ids):
            if self._f is None or (self.shard_tokens and self.counts[-1] >= self.shard_tokens):
                self._open()
            room = self.shard_tokens - self.counts[-1] if self.shard_tokens else len(ids)
            part, ids = ids[:room], ids[room:]
            self._f.write(part.data)
            self.hashes[-1].update(part.data)
            self.counts[-1] += len(part)
            if self.counts[-1] - self.marks[-1][-1][0] >= MARK_TOKENS:
                self.marks[-1].append((self.counts[-1], self.hashes[-1].copy()))

    def _open(self) -> None:
        if self._f is not None:
            self._f.close()
        path = self.dir / shard_name(self.split, len(self.files), self.shard_tokens)
        self.files.append(path)
        self.counts.append(0)
        self.hashes.append(hashlib.sha256())
        self.marks.append([(0, self.hashes[-1].copy())])
        self._f = open(path, "wb")  # noqa: SIM115 (closed in _open/close)

    def close(self) -> list[dict[str, Any]]:
        """Finish the last file; ``[{file, tokens, sha256}]`` (an empty split still gets one empty file)."""
        if self._f is None:
            self._open()
        self._f.close()
        return [
            {"file": p.name, "tokens": n, "sha256": h.hexdigest()}
            for p, n, h in zip(self.files, self.counts, self.hashes)
        ]

    def truncate(self, keep: int) -> list[dict[str, Any]]:
        """After ``close``: keep the first ``keep`` tokens of the split (files past them are deleted)."""
        out, start = [], 0
        for path, n, h, marks in zip(self.files, self.counts, self.hashes, self.marks):
            k = max(0, min(n, keep - start))
            start += n
            if k == 0:
                path.unlink()
                continue
            if k < n:
                os.truncate(path, k * self.dtype.itemsize)
                at, h = max((m for m in marks if m[0] <= k), key=lambda m: m[0])
                h = h.copy()
                with open(path, "rb") as f:
                    f.seek(at * self.dtype.itemsize)
                    h.update(f.read((k - at) * self.dtype.itemsize))
            out.append({"file": path.name, "tokens": k, "sha256": h.hexdigest()})
        return out


def read_tokens(
    directory: Path, entries: list[dict[str, Any]], dtype: np.dtype, start: int, stop: int
) -> np.ndarray:
    """Tokens ``[start, stop)`` of a split written as ``entries`` (read from the files, across shards)."""
    parts, offset = [], 0
    for entry in entries:
        n = int(entry["tokens"])
        lo, hi = max(start - offset, 0), min(stop - offset, n)
        if lo < hi:
            with open(directory / entry["file"], "rb") as f:
                f.seek(lo * dtype.itemsize)
                parts.append(np.frombuffer(f.read((hi - lo) * dtype.itemsize), dtype=dtype))
        offset += n
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


class ShardedTokens:
    """Several token memmaps read as one 1-D array (integer, index-array and slice reads)."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = parts
        self.bounds = np.cumsum([0, *(len(p) for p in parts)]).astype(np.int64)
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return int(self.bounds[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self[np.arange(*index.indices(len(self)), dtype=np.int64)]
        idx = np.asarray(index, dtype=np.int64)
        if idx.ndim == 0:
            return self[idx.reshape(1)][0]
        idx = np.where(idx < 0, idx + len(self), idx)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"token index out of range for {len(self)} tokens")
        out = np.empty(idx.shape, dtype=self.dtype)
        which = np.searchsorted(self.bounds, idx, side="right") - 1  # shard s: b_s ≤ i < b_{s+1}
        for s in np.unique(which):
            sel = which == s
            out[sel] = self.parts[s][idx[sel] - self.bounds[s]]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.concatenate(self.parts)
        return whole if dtype is None else whole.astype(dtype)


def open_split(directory: Path, entries: list[dict[str, Any]], dtype: np.dtype) -> Any:
    """The memmap of a one-file split, or ``ShardedTokens`` over several; a missing or truncated file is
    a one-line ``GptlabError``."""
    parts = []
    for entry in entries:
        path = directory / entry["file"]
        expected = int(entry["tokens"])
        have = path.stat().st_size if path.is_file() else -1
        if have != expected * dtype.itemsize:
            state = "missing" if have < 0 else f"{have // dtype.itemsize} tokens on disk"
            raise GptlabError(
                f"{path}: shard truncated or missing (meta.json says {expected} tokens, {state}); "
                f"prepare the dataset again"
            )
        parts.append(np.memmap(path, dtype=dtype, mode="r") if expected else np.zeros(0, dtype=dtype))
    parts = [p for p in parts if len(p)] or parts[:1]
    return parts[0] if len(parts) == 1 else ShardedTokens(parts)
