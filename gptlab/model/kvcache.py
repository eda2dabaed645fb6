"""A preallocated key/value cache (blueprint "Stage 5: KV Cache Operations").

Per layer, ``K_cache, V_cache ∈ R^{B × H_kv × T_max × d_k}`` are allocated once; a
decode step writes its new ``k_new, v_new`` at the current length and attends over
``K_cache[:, :, :t]``. Per step this costs ``O(t·d_model)`` instead of recomputing
``K, V`` for the whole prefix (``O(t·d_model²)``). Memory: ``2·L·H_kv·T·d_k`` numbers.
"""

from __future__ import annotations

import torch

from gptlab.errors import GptlabError
from gptlab.model.config import GPTConfig


class LayerKVCache:
    """One layer's cache: ``update(k, v)`` appends and returns every key/value so far."""

    def __init__(self, batch: int, n_kv_head: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.k = torch.zeros(batch, n_kv_head, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.size(2)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.size(2)
        if end > self.max_len:
            raise GptlabError(f"KV cache is full: {end} positions needed, {self.max_len} allocated")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class KVCache:
    """The caches of all layers of a model; ``length`` is the number of positions filled."""

    def __init__(self, config: GPTConfig, batch: int, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        assert config.n_kv_head is not None
        max_len = max_len or config.block_size
        self.layers = [LayerKVCache(batch, config.n_kv_head, max_len, config.head_dim, dtype, device)
                       for _ in range(config.n_layer)]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def reset(self) -> None:
        for layer in self.layers:
            layer.length = 0

    def nbytes(self) -> int:
        """Bytes held: ``2·L·B·H_kv·T_max·d_k·bytes_per_number``."""
        return sum(layer.nbytes() for layer in self.layers)
