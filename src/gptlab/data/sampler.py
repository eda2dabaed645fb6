"""Batches from token shards: training windows ``x = w[:T]``, ``y = w[1:]`` (eq. 10's targets are the
inputs shifted by one), sampled without replacement and resumable by step; fixed evaluation windows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gptlab.errors import GptlabError


@dataclass
class WindowSampler:
    """Training windows, sampled without replacement, epoch by epoch.

    The split is cut into ``n`` non-overlapping windows of ``T + 1`` tokens starting
    at ``shift_e + k·T``; epoch ``e`` visits them in the order of a permutation and
    with a shift that both depend only on ``(seed, e)``. Global sample ``g`` is
    therefore a pure function of ``g``: the data position is just the step, so a
    resumed run reads exactly the batches it would have read.

    Row ``j`` of micro-batch ``m`` of step ``s`` on rank ``r`` is sample
    ``((s·A + m)·W + r)·B + j``: ranks read disjoint rows of each global batch, and
    one micro-batch of ``2B`` holds the same rows as two of ``B`` (or two ranks of ``B``).
    ``tokens`` may be a ``ShardedTokens`` (several shard files read as one array): the
    windows, and so exact resume, do not depend on how the split is cut into files.
    """

    tokens: np.ndarray
    block_size: int
    batch_size: int
    seed: int = 0
    grad_accum: int = 1
    world_size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        N, T = len(self.tokens), self.block_size
        if N < T + 1:
            raise GptlabError(
                f"the split has {N} tokens, fewer than one block of block_size + 1 = {T + 1}; "
                f"use a smaller model.block_size or more data"
            )
        self.n = max(1, (N - T) // T)
        self.shift_range = min(T, N - (T + 1) - (self.n - 1) * T + 1)
        self._epochs: dict[int, tuple[int, np.ndarray]] = {}
        self._offsets = np.arange(T + 1, dtype=np.int64)

    def _epoch(self, e: int) -> tuple[int, np.ndarray]:
        if e not in self._epochs:
            rng = np.random.default_rng([self.seed, e])
            shift = int(rng.integers(self.shift_range))
            self._epochs = {k: v for k, v in self._epochs.items() if k >= e - 1}
            self._epochs[e] = (shift, rng.permutation(self.n))
        return self._epochs[e]

    def starts(self, samples: np.ndarray) -> np.ndarray:
        """Token offsets of global samples ``samples``."""
        epochs, ks = np.divmod(samples, self.n)
        out = np.empty(len(samples), dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            shift, perm = self._epoch(int(e))
            out[sel] = shift + perm[ks[sel]] * self.block_size
        return out

    def batch(self, step: int, micro: int = 0) -> tuple[Any, Any]:
        """``(x, y)``: int64 tensors of shape (B, T) for micro-batch ``micro`` of ``step``."""
        import torch

        B = self.batch_size
        first = ((step * self.grad_accum + micro) * self.world_size + self.rank) * B
        starts = self.starts(np.arange(first, first + B, dtype=np.int64))
        w = torch.from_numpy(self.tokens[starts[:, None] + self._offsets].astype(np.int64))  # (B, T + 1)
        return w[:, :-1], w[:, 1:]

    def epoch_of(self, step: int) -> float:
        return (step * self.grad_accum * self.world_size * self.batch_size) / self.n


def eval_batches(
    tokens: np.ndarray, block_size: int, batch_size: int, max_batches: int | None = None
) -> Iterator[tuple[Any, Any]]:
    """Fixed evaluation batches: non-overlapping windows from the start of the split.

    ``max_batches=None`` covers the whole split (its last partial window aside);
    otherwise ``max_batches·B`` windows evenly spread over the split.
    """
    import torch

    T = block_size
    n = (len(tokens) - 1) // T
    if n < 1:
        raise GptlabError(f"the split has {len(tokens)} tokens, fewer than one block of {T + 1}")
    ks = np.arange(n, dtype=np.int64)
    if max_batches is not None and max_batches * batch_size < n:
        ks = np.unique(np.linspace(0, n - 1, max_batches * batch_size).round().astype(np.int64))
    offsets = np.arange(T + 1, dtype=np.int64)
    for i in range(0, len(ks), batch_size):
        w = torch.from_numpy(tokens[ks[i : i + batch_size, None] * T + offsets].astype(np.int64))
        yield w[:, :-1], w[:, 1:]


def n_eval_batches(n_tokens: int, block_size: int, batch_size: int, max_batches: int | None) -> int:
    n = max((n_tokens - 1) // block_size, 0)
    total = math.ceil(n / batch_size)
    return total if max_batches is None else min(total, max_batches)
