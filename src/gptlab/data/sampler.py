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

    Instruction data (``gptlab.data.chat``) comes in rows of ``T + 1`` tokens with a loss
    ``mask`` (targets whose mask is 0 become −1, ignored by the loss) and ``pos``, each
    token's position in its example: windows are then the rows themselves, and packed
    examples get per-example positions and a block-diagonal causal mask (``document_inputs``).
    """

    tokens: np.ndarray
    block_size: int
    batch_size: int
    seed: int = 0
    grad_accum: int = 1
    world_size: int = 1
    rank: int = 0
    mask: np.ndarray | None = None  # rows of instruction data: 1 where the token counts in the loss
    pos: np.ndarray | None = None  # rows of packed examples: position of each token in its example

    def __post_init__(self) -> None:
        N, T = len(self.tokens), self.block_size
        if N < T + 1:
            raise GptlabError(
                f"the split has {N} tokens, fewer than one block of block_size + 1 = {T + 1}; "
                f"use a smaller model.block_size or more data"
            )
        self.stride = T + 1 if self.mask is not None else T  # rows: whole examples, never cut
        self.n = N // self.stride if self.mask is not None else max(1, (N - T) // T)
        self.shift_range = 1 if self.mask is not None else min(T, N - (T + 1) - (self.n - 1) * T + 1)
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
            out[sel] = shift + perm[ks[sel]] * self.stride
        return out

    def batch(self, step: int, micro: int = 0) -> tuple[Any, Any]:
        """``(x, y)``: int64 tensors of shape (B, T) for micro-batch ``micro`` of ``step``."""

        x, y, _ = self.inputs(step, micro)
        return x, y

    def inputs(self, step: int, micro: int = 0) -> tuple[Any, Any, dict[str, Any]]:
        """``(x, y, kwargs)``: ``batch`` plus the model's keyword inputs for packed examples."""
        B = self.batch_size
        first = ((step * self.grad_accum + micro) * self.world_size + self.rank) * B
        starts = self.starts(np.arange(first, first + B, dtype=np.int64))
        return _window(self.tokens, self.mask, self.pos, starts[:, None] + self._offsets)


def _window(
    tokens: np.ndarray, mask: np.ndarray | None, pos: np.ndarray | None, index: np.ndarray
) -> tuple[Any, Any, dict[str, Any]]:
    """``x = w[:, :-1]``, ``y = w[:, 1:]`` (−1 where masked) and the packed-example inputs of windows ``index``."""
    import torch

    w = torch.from_numpy(tokens[index].astype(np.int64))  # (B, T + 1)
    x, y = w[:, :-1], w[:, 1:]
    if mask is not None:
        y = y.masked_fill(torch.from_numpy(mask[index[:, 1:]] == 0), -1)
    kwargs = document_inputs(torch.from_numpy(pos[index[:, :-1]].astype(np.int64))) if pos is not None else {}
    return x, y, kwargs


def document_inputs(pos: Any) -> dict[str, Any]:
    """Per-example positions ``pos`` (B, T) → ``{"pos", "attn_mask"}`` for ``GPT.run``.

    A new example starts where ``pos`` is 0; token ``i`` may see token ``j`` iff ``j ≤ i`` and both
    belong to the same example: a block-diagonal causal mask ``(B, 1, T, T)``.
    """
    import torch

    doc = (pos == 0).cumsum(dim=1)  # (B, T): example number within the row
    T = pos.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    same = doc[:, :, None] == doc[:, None, :]  # (B, T, T)
    return {"pos": pos, "attn_mask": (same & causal)[:, None]}


def eval_batches(
    tokens: np.ndarray,
    block_size: int,
    batch_size: int,
    max_batches: int | None = None,
    mask: np.ndarray | None = None,
    pos: np.ndarray | None = None,
) -> Iterator[tuple[Any, ...]]:
    """Fixed evaluation batches: non-overlapping windows from the start of the split.

    ``max_batches=None`` covers the whole split (its last partial window aside);
    otherwise ``max_batches·B`` windows evenly spread over the split. With a ``mask``
    (instruction rows) the windows are the rows and each batch is ``(x, y, kwargs)``.
    """
    T = block_size
    rows = mask is not None
    stride = T + 1 if rows else T
    n = eval_windows(len(tokens), T, rows)
    ks = np.arange(n, dtype=np.int64)
    if max_batches is not None and max_batches * batch_size < n:
        ks = np.unique(np.linspace(0, n - 1, max_batches * batch_size).round().astype(np.int64))
    offsets = np.arange(T + 1, dtype=np.int64)
    for i in range(0, len(ks), batch_size):
        x, y, kwargs = _window(tokens, mask, pos, ks[i : i + batch_size, None] * stride + offsets)
        yield (x, y, kwargs) if rows else (x, y)


def eval_windows(n_tokens: int, block_size: int, rows: bool = False, split: str = "the split") -> int:
    """The evaluation windows a split of ``n_tokens`` holds: ``⌊(N − 1)/T⌋`` of the token stream,
    ``⌊N/(T + 1)⌋`` rows of instruction data; a ``GptlabError`` where it holds none (what a run checks
    of its validation split before its first step, not at its first evaluation)."""
    n = n_tokens // (block_size + 1) if rows else (n_tokens - 1) // block_size
    if n < 1:
        raise GptlabError(
            f"{split} has {n_tokens} tokens, fewer than one block of block_size + 1 = {block_size + 1}; "
            f"use a smaller model.block_size or more data"
        )
    return n


def n_eval_batches(n_tokens: int, block_size: int, batch_size: int, max_batches: int | None) -> int:
    n = max((n_tokens - 1) // block_size, 0)
    total = math.ceil(n / batch_size)
    return total if max_batches is None else min(total, max_batches)
