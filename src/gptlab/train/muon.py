"""Muon with its Newton–Schulz iteration in a chosen precision (float32 where bf16 is emulated).

Muon (``torch.optim.Muon``), per hidden matrix θ with gradient g and momentum buffer B:

    B ← μ·B + (1−μ)·g,   U = g + μ·(B − g) (Nesterov) or B,   θ ← (1 − η·λ)·θ − η·√max(1, A/C)·NS(U)

and NS orthogonalises U by five quintic Newton–Schulz steps on X = U/‖U‖ (transposed so rows ≤ cols):

    G = X·Xᵀ,   X ← a·X + (b·G + c·G²)·X,   (a, b, c) = (3.4445, −4.7750, 2.0315)

``torch.optim.Muon`` runs NS in bfloat16 (``grad.bfloat16()``). On a CPU without native bf16 those
matrix products are emulated and cost many times the float32 iteration (docs/benchmarks.md#precision);
``muon_class(device_type, dtype)`` then returns ``Float32Muon`` (as it does under ``dtype=float32``),
the same update with NS in float32, run once per stack of same-shaped matrices (``bmm``) rather
than matrix by matrix (the best recipe's NS is markedly shorter that way on an AVX2 CPU). Where bf16 is native it returns
``torch.optim.Muon`` itself. Both keep the same state (``momentum_buffer``), so a checkpoint
resumes under either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch


def newton_schulz(
    update: torch.Tensor,
    coefficients: tuple[float, float, float],
    steps: int,
    eps: float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``NS(U)`` in ``dtype`` for one matrix (m×n) or a stack of same-shaped ones (k×m×n).

    One matrix: the iteration of ``torch.optim.Muon``, identical to it in bfloat16. A stack runs
    each product once for all k matrices (``bmm``), each matrix scaled by its own norm.
    """
    a, b, c = coefficients
    x = update.to(dtype, copy=True)
    tall = update.size(-2) > update.size(-1)
    if tall:
        x = x.mT
    if x.dim() == 2:
        x.div_(x.norm().clamp(min=eps))  # spectral norm ≤ 1
        mm: Callable[..., torch.Tensor] = torch.mm
        addmm: Callable[..., torch.Tensor] = torch.addmm
    else:
        x.div_(torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True).clamp(min=eps))
        mm, addmm = torch.bmm, torch.baddbmm
    for _ in range(steps):
        gram = mm(x, x.mT)  # G = X·Xᵀ
        poly = addmm(gram, gram, gram, beta=b, alpha=c)  # b·G + c·G²
        x = addmm(x, poly, x, beta=a)  # a·X + (b·G + c·G²)·X
    return x.mT if tall else x


def same_shapes(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Indices of ``tensors`` grouped by shape, dtype and device, in first-seen order."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.shape, t.dtype, t.device), []).append(i)
    return list(groups.values())


def lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's learning-rate adjustment for an A×C matrix."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


class Float32Muon(torch.optim.Muon):
    """``torch.optim.Muon`` with Newton–Schulz in ``ns_dtype`` (float32 by default), batched.

    Matrices of one shape are orthogonalised together (``newton_schulz`` on their stack): the
    best recipe's 16 matrices take 3 stacks instead of 16 sequences of small products.
    """

    ns_dtype = torch.float32

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            bufs: list[torch.Tensor] = []
            self._init_group(group, params, grads, bufs)
            lr, mu = float(group["lr"]), group["momentum"]
            updates = []
            for g, buf in zip(grads, bufs, strict=True):
                buf.lerp_(g, 1 - mu)
                updates.append(g.lerp(buf, mu) if group["nesterov"] else buf)
            for idx in same_shapes(updates):
                stack = updates[idx[0]] if len(idx) == 1 else torch.stack([updates[i] for i in idx])
                o = newton_schulz(
                    stack, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype
                )
                for i, oi in zip(idx, [o] if len(idx) == 1 else o.unbind(0), strict=True):
                    p = params[i]
                    p.mul_(1 - lr * group["weight_decay"])
                    p.add_(oi.to(p.dtype), alpha=-lr * lr_ratio(group["adjust_lr_fn"], p.shape))
        return loss


def muon_class(device_type: str, dtype: str = "auto") -> type[torch.optim.Muon]:
    """``torch.optim.Muon`` where NS runs in bfloat16 (``ns_dtype``), else ``Float32Muon``."""
    return torch.optim.Muon if ns_dtype(device_type, dtype) == torch.bfloat16 else Float32Muon


def ns_dtype(device_type: str, dtype: str = "auto") -> torch.dtype:
    """The precision of Newton–Schulz: bfloat16 where it is native on ``device_type``, else float32; and
    float32 wherever training is pinned to ``dtype="float32"`` (all of its arithmetic in float32)."""
    from gptlab.hardware import native_bf16

    return torch.bfloat16 if native_bf16(device_type) and dtype != "float32" else torch.float32
