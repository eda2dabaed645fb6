"""Exact GELU, ``GELU(x) = x·Φ(x) = ½·x·(1 + erf(x/√2))`` (Hendrycks & Gimpel 2016).

Eagerly it is ``F.gelu``. Inside ``torch.compile`` it is ``_CompiledGELU``, whose erf uses the
Abramowitz & Stegun polynomial so that value and derivative share one exponential.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

# Abramowitz & Stegun 7.1.26: erf(z) = 1 − (a₁t + a₂t² + a₃t³ + a₄t⁴ + a₅t⁵)·e^{−z²}, t = 1/(1 + p·z),
# z ≥ 0, |error| ≤ 1.5·10⁻⁷ (the formula ATen's vectorised erf evaluates).
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf_and_gaussian(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(erf(x/√2), e^{−x²/2})`` sharing one exponential (float32 in, float32 out)."""
    z = x * math.sqrt(0.5)
    gauss = torch.exp(-z * z)
    t = 1.0 / (1.0 + _ERF_P * z.abs())
    a1, a2, a3, a4, a5 = _ERF_A
    tail = t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5)))) * gauss  # 1 − erf(|z|)
    return torch.sign(z) * (1.0 - tail), gauss


class _CompiledGELU(torch.autograd.Function):
    """Exact GELU for compiled graphs; its backward computes one exponential, not two.

    ``GELU(x) = ½·x·(1 + erf(x/√2))``, ``GELU'(x) = ½·(1 + erf(x/√2)) + x·φ(x)`` with
    ``φ(x) = e^{−x²/2}/√(2π)``. erf itself needs ``e^{−x²/2}`` (above), so forward and backward
    each evaluate one exponential; ``F.gelu``'s decomposition evaluates two in the backward.
    Agrees with ``F.gelu`` to ~10⁻⁶ in float32 (tested).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        xf = x.float()
        erf, _ = _erf_and_gaussian(xf)
        return (0.5 * xf * (1.0 + erf)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = ctx.saved_tensors[0]
        xf = x.float()
        erf, gauss = _erf_and_gaussian(xf)
        slope = 0.5 * (1.0 + erf) + xf * gauss * (1.0 / math.sqrt(2.0 * math.pi))
        return (grad.float() * slope).to(x.dtype)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """``GELU(x) = x·Φ(x) = ½·x·(1 + erf(x/√2))``: ``F.gelu`` eagerly, ``_CompiledGELU`` inside torch.compile."""
    if torch.compiler.is_compiling():
        y: torch.Tensor = _CompiledGELU.apply(x)  # type: ignore[no-untyped-call]  # torch: Function.apply is untyped
        return y
    return F.gelu(x)
