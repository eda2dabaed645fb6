"""Normalisation layers, chosen by name.

LayerNorm: ``LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β`` over the last dimension.
RMSNorm:   ``RMS(x) = γ ⊙ x / √(mean(x²) + ε)`` (no centring, no bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """``γ ⊙ (x − μ) / √(σ² + ε) + β``, with an optional bias ``β``."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """``γ ⊙ x / √(mean(x²) + ε)``."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)  # bf16 autocast
        return F.rms_norm(x, self.weight.shape, weight, self.eps)


NORMS: dict[str, type[nn.Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def make_norm(name: str, dim: int, eps: float, bias: bool) -> nn.Module:
    return NORMS[name](dim, eps=eps, bias=bias)
