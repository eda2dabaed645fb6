"""Weights for inference: ``quantize(model, "bf16" | "int8")``.

bf16: every parameter is cast to bfloat16 (positional tables stay float32 buffers); on a CPU with
oneDNN bf16 support each ``nn.Linear`` is prepacked into oneDNN's blocked layout (``PackedBF16Linear``).

int8 (weight-only, per output channel): each ``nn.Linear`` weight row ``W_o`` becomes

    q_o = round(W_o / s_o) ∈ [−127, 127],   s_o = max_k |W_o,k| / 127
    y = x·Wᵀ ≈ (x·qᵀ) ⊙ s

and the dequantisation is fused into the matmul by ``torch.ops.aten._weight_int8pack_mm``
(the CPU kernel gpt-fast uses) where torch has it; elsewhere the weight is dequantised on
the fly. Activations, embeddings and norms are bfloat16. A decode step reads about a
quarter of the fp32 bytes, which is what bounds batch-1 speed on a CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.errors import GptlabError

_FUSED = hasattr(torch.ops.aten, "_weight_int8pack_mm")


def _onednn_bf16() -> bool:
    """True where oneDNN can run bf16 matmuls on this CPU from prepacked weights."""
    try:
        return bool(
            torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        )
    except (AttributeError, RuntimeError):
        return False


class PackedBF16Linear(nn.Module):
    """``y = x·Wᵀ + b`` in bf16, with ``W`` reordered once into oneDNN's blocked layout.

    A decode step multiplies a few rows by every weight matrix, so it is bound by how fast
    the weights stream from memory; the blocked layout lets oneDNN's AVX-512-bf16 kernels
    do that at close to bandwidth, where a plain bf16 ``F.linear`` is compute-bound.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().to(torch.bfloat16)
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(w, None), persistent=False)
        bias = linear.bias.detach().to(torch.bfloat16) if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 oneDNN-packed"


class Int8Linear(nn.Module):
    """``y = (x·qᵀ) ⊙ s + b`` with int8 ``q`` (out, in) and one scale per output channel."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # s_o
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(dtype))
        bias = linear.bias.detach().to(dtype) if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        scales = self.scales if self.scales.dtype == x.dtype else self.scales.to(x.dtype)
        if _FUSED and x.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), self.weight, scales)
        else:
            y = F.linear(x2, self.weight.to(x.dtype)) * scales
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def _cast_params(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast parameters (not buffers: positional tables stay float32) to ``dtype``."""
    for p in model.parameters():
        p.data = p.data.to(dtype)


def _to_int8(model: nn.Module) -> None:
    _replace_linears(model, Int8Linear)
    _cast_params(model, torch.bfloat16)


def _to_bf16(model: nn.Module) -> None:
    _cast_params(model, torch.bfloat16)
    device = next(model.parameters()).device
    if device.type == "cpu" and _onednn_bf16():
        _replace_linears(model, PackedBF16Linear)


def _replace_linears(model: nn.Module, make: type[nn.Module]) -> None:
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, make(child))


QUANTIZERS = {
    "fp32": lambda model: _cast_params(model, torch.float32),
    "bf16": _to_bf16,
    "int8": _to_int8,
}


@torch.no_grad()
def quantize(model: nn.Module, mode: str) -> nn.Module:
    """Convert ``model`` in place for inference (``"fp32"``, ``"bf16"`` or ``"int8"``) and return it.

    An int8 model cannot be trained or saved as a checkpoint; keep the float weights for that.
    """
    if mode not in QUANTIZERS:
        raise GptlabError(f"unknown weight format {mode!r}; choose one of {', '.join(QUANTIZERS)}")
    if getattr(model, "quantization", None) == "int8" and mode != "int8":
        raise GptlabError("this model is already int8; load the float checkpoint again to use another format")
    if getattr(model, "quantization", None) == "int8":
        return model
    QUANTIZERS[mode](model)
    model.quantization = mode  # type: ignore[assignment]
    return model.eval()
