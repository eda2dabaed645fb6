"""Positional encodings, chosen by name.

Each encoding answers three questions, and the ones it does not use are no-ops:

* ``embed(x, pos)``: what is added to the token embeddings ``h⁽⁰⁾ = e_x + p_pos``
  (learned: a trained table ``W_p``; sinusoidal: the fixed table below);
* ``rotate(q, k, pos)``: RoPE rotates each pair of query/key features by the angle
  ``pos·θ_i`` with ``θ_i = base^(−2i/d_k)``;
* ``bias(n_q, n_k)``: ALiBi adds ``−m_h·(i − j)`` to the attention score of query
  ``i`` and key ``j``, with head slopes ``m_h = 2^(−8h/H)`` (``−m_h·|i − j|`` when the
  attention is bidirectional).

Sinusoidal: ``PE(pos, 2i) = sin(pos / 10000^(2i/d))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d))``.

``pos`` holds absolute positions, shape ``(T,)`` or ``(B, T)`` (per-sequence
positions for left-padded batches).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gptlab.model.config import GPTConfig


class PositionalEncoding(nn.Module):
    """No positional information (``pos="none"``): the causal mask alone orders tokens."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.block_size = config.block_size

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def bias(
        self, n_q: int, n_k: int, device: torch.device, dtype: torch.dtype, causal: bool = True
    ) -> torch.Tensor | None:
        return None

    #: True when positions beyond ``block_size`` have no meaning (a table lookup).
    absolute_table = False


class LearnedPositions(PositionalEncoding):
    """``h⁽⁰⁾_i = e_{x_i} + p_i`` with ``p_i`` a row of a trained table ``W_p ∈ R^{T_max × d_model}``."""

    absolute_table = True

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = x + self.wpe(pos)
        return y


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """``PE[pos, 2i] = sin(pos/10000^(2i/d))``, ``PE[pos, 2i+1] = cos(pos/10000^(2i/d))``; shape ``(n_pos, dim)``."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(10000.0, two_i / dim)
    table = torch.zeros(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


class SinusoidalPositions(PositionalEncoding):
    """The fixed table of "Attention Is All You Need", added to the token embeddings."""

    absolute_table = True
    table: torch.Tensor  # (T_max, d_model), a buffer

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        self.register_buffer("table", sinusoidal_table(config.block_size, config.n_embd), persistent=False)

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x + self.table[pos].to(x.dtype)


class RotaryPositions(PositionalEncoding):
    """RoPE: rotate feature pairs ``(x_i, x_{i+d/2})`` of q and k by ``pos·θ_i``, ``θ_i = base^(−2i/d_k)``.

    Uses the "half-split" pairing of GPT-NeoX / Hugging Face Llama, so imported
    Llama weights work unchanged. ``q_pos·k_pos`` then depends only on ``pos_q − pos_k``.
    """

    cos: torch.Tensor  # (T_max, d_k), a buffer
    sin: torch.Tensor

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        d = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = torch.outer(torch.arange(config.block_size, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)  # (T_max, d_k)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos[pos], self.sin[pos]  # (T, d_k) or (B, T, d_k)
        if cos.dim() == 3:  # per-sequence positions: broadcast over heads
            cos, sin = cos[:, None], sin[:, None]
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return _rope(q, cos, sin), _rope(k, cos, sin)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x·cos(pos·θ) + rotate_half(x)·sin(pos·θ)``."""
    return x * cos + _rotate_half(x) * sin


def alibi_slopes(n_head: int) -> torch.Tensor:
    """Head slopes ``m_h``: the geometric sequence ``2^(−8/n)…`` of the ALiBi paper (n a power of two;
    otherwise the closest power of two, then interleaved extra slopes)."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_head).is_integer():
        slopes = power_of_two(n_head)
    else:
        closest = 2 ** math.floor(math.log2(n_head))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBiPositions(PositionalEncoding):
    """ALiBi: add ``−m_h·(i − j)`` to the score of query slot ``i`` and key slot ``j``
    (``−m_h·|i − j|`` without the causal mask)."""

    slopes: torch.Tensor  # (H,), a buffer

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)

    def bias(
        self, n_q: int, n_k: int, device: torch.device, dtype: torch.dtype, causal: bool = True
    ) -> torch.Tensor:
        # queries occupy the last n_q of the n_k key slots (a KV cache holds the earlier ones)
        i = torch.arange(n_k - n_q, n_k, device=device)[:, None]
        j = torch.arange(n_k, device=device)[None, :]
        # causal: future keys are masked anyway
        dist = ((i - j).clamp(min=0) if causal else (i - j).abs()).to(torch.float32)
        return (-self.slopes.to(device)[:, None, None] * dist).to(dtype)  # (H, n_q, n_k)


POSITIONAL: dict[str, type[PositionalEncoding]] = {
    "none": PositionalEncoding,
    "learned": LearnedPositions,
    "sinusoidal": SinusoidalPositions,
    "rope": RotaryPositions,
    "alibi": ALiBiPositions,
}
