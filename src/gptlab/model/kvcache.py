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

``KVStore.write/read`` address rows and positions directly; ``LayerKVCache`` (one
shared length, what ``GPT.run`` uses) and ``gptlab.generate.BatchSession`` (a length
per row) are both built on it.
"""

from __future__ import annotations

import torch

from gptlab.errors import GptlabError
from gptlab.model.config import GPTConfig

Rows = slice | torch.Tensor  # a range of batch rows (a view) or row indices (a gather)
Positions = slice | torch.Tensor  # a range for every row, or one position per row


class KVStore:
    """Float storage ``(B, H_kv, T_max, d_k)`` for keys and values."""

    def __init__(
        self,
        batch: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self._allocate((batch, n_kv_head, max_len, head_dim), dtype, device)

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> None:
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

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

    def _tensors(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self._names()]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors())


class Int8KVStore(KVStore):
    """int8 storage with one float32 scale per (row, head, position): ``k ≈ s·q``, ``s = max|k|/127``."""

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> None:
        self.k = torch.zeros(shape, dtype=torch.int8, device=device)
        self.v = torch.zeros_like(self.k)
        self.k_scale = torch.zeros(*shape[:-1], 1, dtype=torch.float32, device=device)
        self.v_scale = torch.zeros_like(self.k_scale)
        self.compute_dtype = torch.float32  # off a CPU, reads dequantise to the dtype keys were written in

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
    else:  # one position per row: advanced indices on dims 0 and 2 → (n, H_kv, d)
        if isinstance(rows, slice):
            rows = torch.arange(store.size(0), device=store.device)[rows]
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
    store_type = STORES.get(dtype, KVStore)
    return store_type(batch, n_kv_head, max_len, head_dim, dtype, device)


STORES: dict[torch.dtype, type[KVStore]] = {torch.int8: Int8KVStore}


class LayerKVCache:
    """One layer's cache: ``update(k, v)`` appends and returns every key/value so far."""

    def __init__(
        self,
        batch: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.store = make_store(batch, n_kv_head, max_len, head_dim, dtype, device)
        self.length = 0

    @property
    def k(self) -> torch.Tensor:
        return self.store.k

    @property
    def v(self) -> torch.Tensor:
        return self.store.v

    @property
    def max_len(self) -> int:
        return self.store.max_len

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``K_full = [K_cache; k_new]``: write (B, H_kv, T, d_k) at ``length``, return ``[0, length + T)``."""
        end = self.length + k.size(2)
        if end > self.max_len:
            raise GptlabError(f"KV cache is full: {end} positions needed, {self.max_len} allocated")
        rows = slice(None)
        self.store.write(rows, slice(self.length, end), k, v)
        self.length = end
        return self.store.read(rows, end)

    def nbytes(self) -> int:
        return self.store.nbytes()


class KVCache:
    """The caches of all layers of a model; ``length`` is the number of positions filled.

    ``dtype`` is the storage type: the model's dtype, ``torch.bfloat16``, or
    ``torch.int8`` (quantised with per-head scales).
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
        self.layers = [
            LayerKVCache(batch, config.n_kv_head, max_len, config.head_dim, dtype, device)
            for _ in range(config.n_layer)
        ]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def nbytes(self) -> int:
        """Bytes held: ``2·L·B·H_kv·T_max·d_k·bytes_per_number`` (+ the int8 scales)."""
        return sum(layer.nbytes() for layer in self.layers)


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
