"""FP8 matrix products for training on NVIDIA GPUs of compute capability ≥ 8.9 (H100, L4, RTX 40xx).

A linear layer ``y = x·Wᵀ + b`` whose products run on the FP8 tensor cores (twice bf16's rate on
an H100) through ``torch._scaled_mm``, with dynamic tensorwise scaling:

    s_t  = f_max / max(amax(|t|), ε)          one scale per tensor, from this step's values
    t₈   = cast(clamp(s_t·t, −f_max, f_max))  f_max = 448 (float8_e4m3fn) or 57,344 (float8_e5m2)
    a₈·b₈ / (s_a·s_b) ≈ a·b                   _scaled_mm multiplies by the inverse scales 1/s

    forward      y  = (x₈ · W₈ᵀ) / (s_x·s_W)        x, W in e4m3 (3 mantissa bits: precision)
    backward  ∂L/∂x = (g₈ · W₈) / (s_g·s_W)         g = ∂L/∂y in e5m2 (5 exponent bits: range)
              ∂L/∂W = (x₈ᵀ · g₈)ᵀ / (s_x·s_g)       wgrad="fp8" (e5m2 × e5m2 is not offered)
                    = gᵀ · x                       wgrad="bf16" (the default: no transposed g₈)

``_scaled_mm(a, b)`` wants ``a`` (M, K) row-major and ``b`` (K, N) column-major, with K and N
multiples of 16: the forward's ``W₈ᵀ`` is already column-major; the backward makes the transposed
copies (of one-byte tensors). ``wgrad`` chooses ∂L/∂W's product (``WGRAD``): in FP8 it needs g₈
transposed in memory, one more pass over g, which costs more than it saves at GPT-2's widths.
Rows of ``x`` are padded with zeros to a multiple of 16, which adds nothing to ``∂L/∂W``. The bias
is added in the output's precision (bf16 under autocast). The weights stay what they were (float32
masters): FP8 is how the products are computed, not how anything is stored, so a checkpoint is the same safetensors file either way.
Without gradients (evaluation, sampling) the layer is an ordinary ``nn.Linear``.

``enable_fp8(model, ["mlp", "head"], device)`` swaps the named groups' ``nn.Linear`` layers for
``FP8Linear`` (the same parameters, the same names); ``FP8_LAYERS`` maps each group name to its
layers. On any other device it is an error: ``_scaled_mm`` also runs on the CPU, which the tests
use, but there it is a slow reference, not a speed-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.errors import GptlabError

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: torch.finfo(E4M3).max, E5M2: torch.finfo(E5M2).max}  # 448, 57,344
AMAX_EPS = 1e-12  # an all-zero tensor gets a finite scale (and stays zero)
ALIGN = 16  # _scaled_mm: K and N (and so the rows of x, the K of ∂L/∂W) in multiples of 16
MIN_CAPABILITY = (8, 9)
NEEDS = "fp8 needs an NVIDIA GPU of compute capability ≥ 8.9 (H100, L4, RTX 40xx)"


def quantize(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t₈, 1/s)``: ``t`` scaled so its largest magnitude is ``dtype``'s largest value, cast to
    ``dtype``; ``1/s`` (a float32 scalar tensor) undoes the scale."""
    amax = t.detach().abs().amax().float()
    scale = FP8_MAX[dtype] / amax.clamp(min=AMAX_EPS)
    t8 = (t.float() * scale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    return t8, scale.reciprocal()


def dequantize(t8: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """``t₈ / s`` in float32: what ``quantize`` kept of ``t``."""
    return t8.float() * inv_scale


def column_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` (K, N) with the same values laid out column by column (stride (1, K))."""
    return t.t().contiguous().t()


def scaled_mm(
    a: torch.Tensor,  # (M, K) row-major, float8
    b: torch.Tensor,  # (K, N) column-major, float8
    a_inv: torch.Tensor,  # 1/s_a
    b_inv: torch.Tensor,  # 1/s_b
    out_dtype: torch.dtype,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``(a·b) / (s_a·s_b)`` (M, N) in ``out_dtype``, with the layouts checked here, on every device,
    so that a CPU test notices an operand the GPU kernel would refuse."""
    assert a.stride(1) == 1, f"scaled_mm: mat1 must be row-major, strides {a.stride()}"
    assert b.stride(0) == 1, f"scaled_mm: mat2 must be column-major, strides {b.stride()}"
    assert a.size(1) % ALIGN == 0 and b.size(1) % ALIGN == 0, f"scaled_mm: {a.shape} · {b.shape}"
    assert not (a.dtype == E5M2 and b.dtype == E5M2), "scaled_mm: e5m2 × e5m2 is not supported"
    return torch._scaled_mm(
        a, b, scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype, use_fast_accum=fast_accum
    )


Tensors = tuple[torch.Tensor, ...]


def _keep_fp8(x: torch.Tensor, x8: torch.Tensor, x_inv: torch.Tensor, dtype: torch.dtype) -> Tensors:
    return x8.t().contiguous(), x_inv  # x₈ᵀ (K, M) row-major: mat1 of x₈ᵀ·g₈


def _wgrad_fp8(
    g: torch.Tensor,
    g8: torch.Tensor,
    g_inv: torch.Tensor,
    x8t: torch.Tensor,
    x_inv: torch.Tensor,
    w_dtype: torch.dtype,
) -> torch.Tensor:
    # (K, M)·(M, N) → (K, N), then its transpose: faster than g₈ᵀ·x₈ for the head's shapes
    return scaled_mm(x8t, column_major(g8), x_inv, g_inv, w_dtype).t()


def _keep_bf16(x: torch.Tensor, x8: torch.Tensor, x_inv: torch.Tensor, dtype: torch.dtype) -> Tensors:
    return (x.to(dtype),)  # x in the output's dtype (bf16 under autocast), as nn.Linear keeps it


def _wgrad_bf16(
    g: torch.Tensor, g8: torch.Tensor, g_inv: torch.Tensor, x: torch.Tensor, w_dtype: torch.dtype
) -> torch.Tensor:
    return (g.t() @ x).to(w_dtype)  # gᵀ·x (N, K): cuBLAS reads the transposes in place


#: ``wgrad``: how ∂L/∂W = gᵀ·x is computed: ``(what the forward keeps, the product)``. ``fp8`` needs
#: g₈ transposed in memory (one more pass over g, which for the head is B·T × V); ``bf16`` keeps x
#: as nn.Linear does and skips that copy, so it is the default (docs/benchmarks.md#precision)
Keep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], Tensors]
WGRAD: dict[str, tuple[Keep, Callable[..., torch.Tensor]]] = {
    "fp8": (_keep_fp8, _wgrad_fp8),
    "bf16": (_keep_bf16, _wgrad_bf16),
}


class FP8Matmul(torch.autograd.Function):
    """``x·Wᵀ`` with its products in FP8 (module docstring): x (M, K), M a multiple of 16; W (N, K).
    ∂L/∂W in FP8 too with ``wgrad="fp8"``, in ``out_dtype`` with ``wgrad="bf16"``."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype, wgrad: str
    ) -> torch.Tensor:
        x8, x_inv = quantize(x, E4M3)  # (M, K)
        w8, w_inv = quantize(w, E4M3)  # (N, K)
        keep, _ = WGRAD[wgrad]
        ctx.save_for_backward(w8, w_inv, *keep(x, x8, x_inv, out_dtype))
        ctx.dtypes, ctx.wgrad = (x.dtype, w.dtype), wgrad
        return scaled_mm(x8, w8.t(), x_inv, w_inv, out_dtype, fast_accum=True)  # (M, N)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None, None]:
        w8, w_inv, *kept = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        g = g.contiguous()  # (M, N)
        g8, g_inv = quantize(g, E5M2)
        grad_x = scaled_mm(g8, column_major(w8), g_inv, w_inv, x_dtype)  # (M, N)·(N, K) → (M, K)
        grad_w = WGRAD[ctx.wgrad][1](g, g8, g_inv, *kept, w_dtype) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None


def output_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.Linear`` would return here: autocast's, where it is on, else ``x``'s."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, wgrad: str = "bf16"
) -> torch.Tensor:
    """``x·Wᵀ + b`` for x (…, K) through ``FP8Matmul`` (rows padded to a multiple of 16)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()  # (M, K) row-major (the casts keep a view's strides)
    rows = x2.size(0)
    pad = -rows % ALIGN
    if pad:
        x2 = F.pad(x2, (0, 0, 0, pad))
    y: torch.Tensor = FP8Matmul.apply(x2, weight, output_dtype(x), wgrad)  # type: ignore[no-untyped-call]  # torch: Function.apply is untyped
    y = y[:rows] if pad else y
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*shape[:-1], weight.size(0))


class FP8Linear(nn.Linear):
    """An ``nn.Linear`` whose training products run in FP8; without gradients it is the plain layer."""

    wgrad = "bf16"  # how ∂L/∂W is computed: a key of WGRAD

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():  # evaluation and sampling: the weights as they are
            return super().forward(x)
        return fp8_linear(x, self.weight, self.bias, self.wgrad)

    @classmethod
    def from_linear(cls, linear: nn.Linear, wgrad: str = "bf16") -> FP8Linear:
        """An ``FP8Linear`` holding ``linear``'s own parameters (tied weights stay tied)."""
        new = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        new.wgrad = wgrad
        new.weight = linear.weight
        new.bias = linear.bias
        new.__dict__.update({k: v for k, v in linear.__dict__.items() if not k.startswith("_")})
        return new


def _inside(*parts: str) -> Callable[[str], bool]:
    """Layers inside a sub-module named one of ``parts`` (a MoE router, a few columns, left out)."""
    return lambda name: bool(set(name.split(".")[:-1]) & set(parts)) and not name.endswith(".router")


#: group name → which linear layers (by module name) it covers; ``all`` is every group
FP8_LAYERS: dict[str, Callable[[str], bool]] = {
    "mlp": _inside("mlp"),  # fc/proj, gate/up/proj, a mixture's experts
    "attn": _inside("attn", "cross_attn"),  # qkv and the output projection; cross-attention's q, kv, proj
    "head": lambda name: name == "lm_head",
}
FP8_CHOICES = (*FP8_LAYERS, "all")


def check_choice(layers: Iterable[str]) -> list[str]:
    """``layers`` as a list of group names, or a ``GptlabError`` naming the valid ones."""
    layers = list(layers)
    unknown = [g for g in layers if g not in FP8_CHOICES]
    if unknown:
        raise GptlabError(f"fp8: unknown layer group(s) {unknown}; choose from {', '.join(FP8_CHOICES)}")
    return list(FP8_LAYERS) if "all" in layers else layers


def check_device(device: str | torch.device) -> None:
    """``GptlabError`` unless ``device`` is a CUDA GPU with FP8 tensor cores (capability ≥ 8.9)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise GptlabError(f"{NEEDS}; this device is {dev.type} (leave fp8 empty: fp8=[])")
    cap = torch.cuda.get_device_capability(dev)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(dev)
        raise GptlabError(f"{NEEDS}; this device is {name}, capability {cap[0]}.{cap[1]}")


def enable_fp8(
    model: nn.Module,
    layers: Iterable[str],
    device: str | torch.device | None = None,
    *,
    wgrad: str = "bf16",
    check: bool = True,
) -> list[str]:
    """Swap the ``nn.Linear`` layers of the named groups for ``FP8Linear`` (in place); returns their
    names. ``wgrad`` names how ∂L/∂W is computed (``WGRAD``). ``check=False`` skips the device check
    (the CPU tests: a slow reference, not a speed-up)."""
    groups = check_choice(layers)
    if wgrad not in WGRAD:
        raise GptlabError(f"fp8_wgrad must be one of {', '.join(WGRAD)}; got {wgrad!r}")
    if not groups:
        return []
    if check:
        check_device(device if device is not None else next(model.parameters()).device)
    chosen = [
        name
        for name, module in model.named_modules()
        if type(module) is nn.Linear and any(FP8_LAYERS[g](name) for g in groups)
    ]
    if not chosen:
        raise GptlabError(f"fp8={groups} matches no linear layer of this model")
    for name in chosen:
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear)  # chosen above: type(module) is nn.Linear
        odd = [d for d in (linear.in_features, linear.out_features) if d % ALIGN]
        if odd:
            raise GptlabError(
                f"fp8: layer {name} is {linear.in_features} → {linear.out_features}; FP8 products need "
                f"multiples of {ALIGN} (for the head: model.vocab_multiple=64), or leave it out of fp8"
            )
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, FP8Linear.from_linear(linear, wgrad))
    return chosen
