"""Token shards: a split stored as numbered files ``train-00000.bin``, ``train-00001.bin``, … of at most
``M`` tokens each, written as a stream and read back as one array.

``ShardWriter`` appends token ids and starts a new file every ``M`` tokens (``M = 0``: one file,
``train.bin``, the single-file layout). ``ShardedTokens`` reads the files as memmaps and
indexes them like one 1-D array: global token ``i`` is token ``i − b_s`` of shard ``s`` where
``b_s ≤ i < b_{s+1}`` (``b`` the cumulative token counts), so a training window may straddle
two shards and the sampler's sample ``g`` → window mapping does not depend on the sharding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gptlab.errors import GptlabError

COPY_TOKENS = 1 << 22  # tokens moved at a time when a split is re-cut


def shard_name(split: str, index: int, shard_tokens: int) -> str:
    """``train-00003.bin``; ``train.bin`` when unsharded (``shard_tokens = 0``)."""
    return f"{split}-{index:05d}.bin" if shard_tokens else f"{split}.bin"


class ShardWriter:
    """Append token ids (numpy arrays) to ``split-NNNNN.bin`` files of at most ``shard_tokens`` tokens."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int = 0) -> None:
        self.dir, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.files: list[Path] = []
        self.counts: list[int] = []
        self._f: Any = None

    def write(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids):
            if self._f is None or (self.shard_tokens and self.counts[-1] >= self.shard_tokens):
                self._open()
            room = self.shard_tokens - self.counts[-1] if self.shard_tokens else len(ids)
            part, ids = ids[:room], ids[room:]
            part.tofile(self._f)
            self.counts[-1] += len(part)

    def _open(self) -> None:
        if self._f is not None:
            self._f.close()
        path = self.dir / shard_name(self.split, len(self.files), self.shard_tokens)
        self.files.append(path)
        self.counts.append(0)
        self._f = open(path, "wb")  # noqa: SIM115 (closed in _open/close)

    def close(self) -> list[dict[str, Any]]:
        """Finish the last file; ``[{file, tokens}]`` (an empty split still gets one empty file)."""
        if self._f is None:
            self._open()
        self._f.close()
        return [{"file": p.name, "tokens": n} for p, n in zip(self.files, self.counts)]


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
