"""A preallocated key/value cache (blueprint "Stage 5: KV Cache Operations").

Per layer, ``K_cache, V_cache ∈ R^{B × H_kv × T_max × d_k}`` are allocated once; a
decode step writes its new ``k_new, v_new`` at the current length and attends over
``K_full = [K_cache; k_new]``. Per step this costs ``O(t·d_model)`` instead of
recomputing ``K, V`` for the whole prefix (``O(t·d_model²)``). Memory:
``2·L·B·H_kv·T_max·d_k`` numbers.

Storage is chosen by the cache dtype:

* a float dtype (float32, bfloat16, float16): the numbers themselves, read back as stored
  (attention then computes in the wider of the activations' and the cache's dtypes);
* ``torch.int8``: ``k ≈ s·q`` with ``q ∈ [−127, 127]`` and one scale ``s = max|k|/127``
  per (sequence, head, position), i.e. a scale per head for every cached vector.
  Reads dequantise to the dtype the keys were written in.

``KVStore.write/read`` address rows and positions directly. What an attention layer sees as its
cache is a ``KVView`` of one store: rows ``R`` written at positions ``P``, then read over ``[0, end)``.
Every path builds the same view: ``KVCache`` (one shared length, appended to by each pass), the
dynamic session's rows (``gptlab.generate.BatchSession``, a length per row), the compiled one-row
step, the static cache's fixed-address rows, and scoring's shared contexts.

What ``GPT.run`` takes as ``cache`` is a ``LayeredCache``: one ``LayerCache`` per layer, an object
with ``update(k_new, v_new) → (K_full, V_full)``; a ``KVCache`` or a list of ``KVView``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from gptlab.errors import GptlabError
from gptlab.model.config import GPTConfig

Rows = slice | torch.Tensor  # a range of batch rows (a view) or row indices (a gather)
Positions = slice | torch.Tensor  # a range for every row, or one position per row


class LayerCache(Protocol):
    """One attention layer's cache: store ``k_new, v_new`` (n, H_kv, T, d_k), return what to attend over."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


#: What ``GPT.run`` calls ``cache``: ``cache[l]`` is layer ``l``'s ``LayerCache``.
LayeredCache = Sequence[LayerCache]


class KVStore:
    """Float storage ``(B, H_kv, T_max, d_k)`` for keys and values: ``k``, ``v`` (``allocate`` makes them)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    @classmethod
    def allocate(cls, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> KVStore:
        k = torch.zeros(shape, dtype=dtype, device=device)
        return cls(k, torch.zeros_like(k))

    @property
    def max_len(self) -> int:
        return self.k.size(2)

    def write(self, rows: Rows, positions: Positions, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k, v`` (n, H_kv, T, d_k) at ``positions`` of ``rows``.

        ``positions`` is a slice of length T (the same for every row) or a tensor (n,)
        of one position per row (T = 1).
        """
        _scatter(self.k, rows, positions, k.to(self.k.dtype))
        _scatter(self.v, rows, positions, v.to(self.v.dtype))

    def read(self, rows: Rows, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``rows`` at positions ``[0, end)``: (n, H_kv, end, d_k), as stored."""
        return self.k[rows, :, :end], self.v[rows, :, :end]

    def resize(self, capacity: int) -> None:
        """Re-allocate the time dim to ``capacity`` positions, keeping positions ``[0, capacity)`` stored."""
        if capacity == self.max_len:
            return
        keep = min(capacity, self.max_len)
        for name in self._names():
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], capacity, *old.shape[3:])
            new[:, :, :keep] = old[:, :, :keep]
            setattr(self, name, new)

    def _names(self) -> tuple[str, ...]:
        return ("k", "v")

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self._names()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


class Int8KVStore(KVStore):
    """int8 storage with one float32 scale per (row, head, position): ``k ≈ s·q``, ``s = max|k|/127``."""

    def __init__(
        self, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor
    ) -> None:
        super().__init__(k, v)
        self.k_scale, self.v_scale = k_scale, v_scale
        self.compute_dtype = torch.float32  # off a CPU, reads dequantise to the dtype keys were written in

    @classmethod
    def allocate(cls, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> KVStore:
        k = torch.zeros(shape, dtype=torch.int8, device=device)
        scale = torch.zeros(*shape[:-1], 1, dtype=torch.float32, device=device)
        return cls(k, torch.zeros_like(k), scale, torch.zeros_like(scale))

    def write(self, rows: Rows, positions: Positions, k: torch.Tensor, v: torch.Tensor) -> None:
        self.compute_dtype = k.dtype
        for x, q_store, s_store in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            q, scale = quantize_int8(x)
            _scatter(q_store, rows, positions, q)
            _scatter(s_store, rows, positions, scale)

    def read(self, rows: Rows, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        # float32 on a CPU, where half-precision attention is slow (see default_cache_dtype)
        dt = torch.float32 if self.k.device.type == "cpu" else self.compute_dtype
        k = self.k[rows, :, :end].to(dt) * self.k_scale[rows, :, :end].to(dt)
        v = self.v[rows, :, :end].to(dt) * self.v_scale[rows, :, :end].to(dt)
        return k, v

    def _names(self) -> tuple[str, ...]:
        return ("k", "v", "k_scale", "v_scale")


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 over the last dim: ``x ≈ s·q``, ``s = max|x|/127`` → (q int8, s float32 (…, 1))."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.0
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def _scatter(store: torch.Tensor, rows: Rows, positions: Positions, x: torch.Tensor) -> None:
    if isinstance(positions, slice):
        store[rows, :, positions] = x  # (n, H_kv, T, d)
    elif isinstance(rows, slice):  # one position per row of a view: store[r, :, p_r] = x[r, :, 0]
        n, h, _, d = x.shape
        store[rows].scatter_(2, positions.view(n, 1, 1, 1).expand(n, h, 1, d), x)
    else:  # one position per row of a gather: advanced indices on dims 0 and 2 → (n, H_kv, d)
        store[rows, :, positions] = x[:, :, 0]


def default_cache_dtype(model_dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The model's dtype, except float32 for half-precision weights on a CPU.

    There a decode step's bf16 attention is slower than converting the new query to float32 and
    attending over a float32 cache (docs/benchmarks.md#decoding), so speed is chosen over the
    cache's memory, which doubles. Pass a cache dtype to choose.
    """
    half = model_dtype in (torch.bfloat16, torch.float16)
    return torch.float32 if half and torch.device(device).type == "cpu" else model_dtype


def make_store(
    batch: int, n_kv_head: int, max_len: int, head_dim: int, dtype: torch.dtype, device: torch.device | str
) -> KVStore:
    """A float store, or an int8 store with per-head scales for ``dtype=torch.int8``."""
    return STORES.get(dtype, KVStore).allocate((batch, n_kv_head, max_len, head_dim), dtype, device)


STORES: dict[torch.dtype, type[KVStore]] = {torch.int8: Int8KVStore}


class KVView:
    """One layer's keys and values for rows ``R`` at positions ``P``: what an attention layer sees as
    its cache during one forward pass. Whoever runs the pass sets ``rows``, ``write`` and ``end``
    beforehand; the layer calls ``update(k, v)`` with the pass's new keys and values
    (n, H_kv, T, d_k), ``n = |R|``:

        write = p:     K[R, :, P] = k,  V[R, :, P] = v     p an int: P = [p, p + T) in every row;
                                                          a tensor (n,): one position per row (T = 1)
        write = None:  nothing is stored
        returns        K[R, :, :end], V[R, :, :end]        what is stored after the write (int8:
                                                          dequantised, see ``Int8KVStore.read``)
                       [K[R, :, :end]; k], [V[R, :, :end]; v]    when nothing was stored
                       k, v                                end = None: a pass from position 0 attends
                                                          over its own keys only (stored or not)

    ``R`` is a slice (the reads are views) or a tensor of row indices (a gather: the reads are copies,
    and a row may appear more than once). The attributes are plain (no properties, no dicts, and ints
    rather than slices: dynamo specialises a slice that holds a symbolic size), so a step that
    ``torch.compile`` or ``torch.export`` traces builds its views inside the graph.
    """

    __slots__ = ("store", "rows", "write", "end")

    def __init__(
        self,
        store: KVStore,
        rows: Rows | None = None,
        write: int | torch.Tensor | None = None,
        end: int | None = None,
    ) -> None:
        # rows=None: every row. The slice is made here, not kept as a default: dynamo before torch
        # 2.13 cannot trace a constructor whose default argument is a slice (it falls back to eager)
        self.store, self.rows, self.write, self.end = store, slice(None) if rows is None else rows, write, end

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        write = self.write
        if write is not None:
            positions = write if isinstance(write, torch.Tensor) else slice(write, write + k.size(2))
            self.store.write(self.rows, positions, k, v)
        if self.end is None:
            return k, v
        keys, values = self.store.read(self.rows, self.end)
        if self.write is None:
            return torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        return keys, values


class KVCache(list[KVView]):
    """The caches of all layers of a model, one ``KVView`` each; ``length`` positions are filled.

    ``dtype`` is the storage type: the model's dtype, ``torch.bfloat16``, or
    ``torch.int8`` (quantised with per-head scales). ``GPT.run`` calls ``advance(T)`` before a pass
    of ``T`` tokens: every view then writes at ``[length, length + T)`` and reads ``[0, length + T)``.
    """

    def __init__(
        self,
        config: GPTConfig,
        batch: int,
        max_len: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        assert config.n_kv_head is not None
        max_len = max_len or config.block_size
        super().__init__(
            KVView(make_store(batch, config.n_kv_head, max_len, config.head_dim, dtype, device))
            for _ in range(config.n_layer)
        )
        self.length = 0

    @property
    def max_len(self) -> int:
        return self[0].store.max_len

    def advance(self, T: int) -> None:
        """Aim every layer at the next ``T`` positions: ``K_full = [K_cache; k_new]``."""
        end = self.length + T
        if end > self.max_len:
            raise GptlabError(f"KV cache is full: {end} positions needed, {self.max_len} allocated")
        for view in self:
            view.write, view.end = self.length, end
        self.length = end

    def nbytes(self) -> int:
        """Bytes held: ``2·L·B·H_kv·T_max·d_k·bytes_per_number`` (+ the int8 scales)."""
        return sum(view.store.nbytes() for view in self)


class StaticKVCache:
    """Keys and values at fixed addresses, for decode steps captured as CUDA graphs.

    Per layer ``k_l, v_l ∈ R^{B_max × H_kv × T_max × d_k}``, allocated once and marked on CUDA
    with ``torch._dynamo.mark_static_address``: a compiled step that writes into them keeps its CUDA
    graph (a cache passed as ordinary tensor arguments makes inductor skip the graph, "mutated
    inputs"). Row ``r`` holds one sequence at positions ``[0, length_r)``; the step writes the new
    ``k_t, v_t`` of row r at ``length_r`` and attends over all ``T_max`` slots under a mask
    ``j ≤ length_r``, so every shape is fixed. (Plain tensors, not a module's buffers: dynamo
    guards a module's buffers by identity, so a step compiled for one cache would recompile for
    the next; on a CPU a step serves every session of its model.)
    """

    def __init__(
        self,
        config: GPTConfig,
        batch: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if not dtype.is_floating_point:
            raise GptlabError(f"a static KV cache stores floats; {dtype} is not one (use the dynamic cache)")
        assert config.n_kv_head is not None
        shape = (batch, config.n_kv_head, max_len, config.head_dim)
        self.keys, self.values = (
            [mark_static(torch.zeros(shape, dtype=dtype, device=device)) for _ in range(config.n_layer)]
            for _ in range(2)
        )
        self.n_layer, self.max_len, self.dtype = config.n_layer, max_len, dtype

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s ``(K, V)``, each ``(B_max, H_kv, T_max, d_k)``."""
        return self.keys[i], self.values[i]

    def tensors(self) -> list[torch.Tensor]:
        return [*self.keys, *self.values]

    def move_row(self, dst: int, src: int, end: int) -> None:
        """Copy positions ``[0, end)`` of row ``src`` into row ``dst`` in every layer."""
        for t in self.tensors():
            t[dst, :, :end] = t[src, :, :end]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def mark_static(t: torch.Tensor) -> torch.Tensor:
    """Tell ``torch.compile`` that ``t`` never moves (so CUDA graphs may write into it in place).

    Only on CUDA: a static address is guarded by identity, so on a CPU (no graphs to replay) it
    would make a new session's buffers recompile a step that an earlier session compiled.
    """
    if t.device.type == "cuda":
        torch._dynamo.mark_static_address(t)
    return t
