"""Weights for inference: ``quantize(model, "fp32" | "bf16" | "int8" | "int4")``.

Every ``nn.Linear`` becomes an inference linear ``y = x·Wᵀ + b`` whose weight is stored as

* fp32: the model's own parameters (tied weights stay tied);
* bf16: the matrices cast to bfloat16; the rest (embeddings, norms) too where bf16 is native,
  float32 elsewhere, so that activations are computed in float32 on a CPU that emulates bf16
  (positional tables stay float32 buffers);
* int8 (weight-only, per output channel): ``q_o = round(W_o / s_o) ∈ [−127, 127]``,
  ``s_o = max_k |W_o,k| / 127``, so ``y ≈ (x·qᵀ) ⊙ s``; the token embedding is int8 too, one
  scale per row, ``e_x = q_x·s_x`` (a tied table is the head's own int8 matrix: a row of W_e is an
  output channel of the head, so it is stored once); activations and norms are bf16 where bf16 is
  native, float32 elsewhere;
* int4 (weight-only, groups of ``INT4_GROUP`` = 32 inputs, PyTorch's layout): ``w = (q − 8)·s + z``
  with ``q ∈ [0, 15]`` and one scale ``s`` and offset ``z`` per group of 32 weights of an output
  channel, multiplied by ``torch.ops.aten._weight_int4pack_mm_for_cpu``. From float weights the
  groups are asymmetric min/max (``s = (max − min)/15``, ``z = min + 8s``); a GGUF file's Q4_0
  (``w = d·(q − 8)``: ``s = d``, ``z = 0``) and Q4_1 (``w = d·q + m``: ``s = d``, ``z = m + 8d``)
  blocks are carried over as they are (``gptlab.interop.gguf``). The kernel reads ``s`` and ``z``
  as bf16, so an fp16 ``d`` rounds to 8 significant bits (a relative 2⁻⁹ at most) and the
  activations enter it as bf16. The output head and the token table are int8 (no int4 kernel
  gathers rows), as llama.cpp's 4-bit files keep them at 8 bits or more (``gptlab.model.int4``).

A decode step multiplies one row by every matrix, so it is bound by how fast the weights stream
from memory. Where ``gptlab.hardware.one_row_kernel`` says ``compiled`` (a CPU below native bf16),
in models whose matrices total ``STREAM_MIN_BYTES`` or more, that one-row product is ``gemv``,
``y_o = s_o·Σ_k x_k·w_ok``, written as one reduction that inductor compiles into a single pass over
the weights, converting each one to float in registers (no (N, K) temporary); where bf16 is native
the library kernels below read the weights faster (docs/benchmarks.md, "The one-row product"). More rows (a prefill, a batch of sequences) use each format's
batched kernel: ``F.linear``; bf16 weights prepacked for oneDNN's bf16 kernels where the CPU has
native bf16, and multiplied in float32 where it only emulates bf16 (``gptlab.hardware``: an
emulated bf16 product is many times slower than a float32 one on an AVX2 CPU); int8
through ``torch.ops.aten._weight_int8pack_mm`` (the CPU kernel gpt-fast uses) for a few rows, and as
``(x · qᵀ) ⊙ s`` through the float kernels from ``int8_float_rows`` on (and where torch lacks the
kernel), with bf16 activations where bf16 is native and float32 elsewhere.
Without a C++ compiler the one-row product uses those too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from gptlab import hardware
from gptlab.compiling import Compiled
from gptlab.model.kvcache import quantize_int8

M = TypeVar("M", bound=nn.Module)  # a model, returned as the type it came in as

_FUSED = hasattr(torch.ops.aten, "_weight_int8pack_mm")


def gemv(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """``y_o = s_o · Σ_k x_k·w_ok + b_o`` (``s = 1``, ``b = 0`` when None) for one row x (1, K), w (N, K).

    float32 sums, x's dtype out. A broadcast product and a sum, so that compiled the weights
    (fp32, bf16 or int8) stream through once and nothing (N, K) is materialised.
    """
    y = (x.float()[:, None, :] * w.float()[None]).sum(-1)
    if scale is not None:
        y = y * scale.float()
    return y.to(x.dtype) if bias is None else (y.to(x.dtype) + bias.to(x.dtype))


# one compiled kernel family per weight dtype, each with its own recompilation budget
_GEMV = {
    dtype: Compiled(gemv, f"the one-row decode kernel ({dtype})", dynamic=True)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int8)
}
# A model whose matrices fit in the CPU's caches gains nothing from the one-row kernel (the
# library kernels are as fast there) and would only wait for its compilation.
STREAM_MIN_BYTES = 32 * 2**20
# Where bf16 is emulated (AVX2), a bf16 product of 1–2 rows reads W as fast as float32 does, and from
# ~8 rows on it is compute-bound and slower than converting W to float32 and multiplying there
# (docs/benchmarks.md#precision).
UPCAST_MIN_ROWS = 8
#: From how many rows an int8 matrix is multiplied as ``(x · qᵀ) ⊙ s`` by the float kernels, q converted
#: to the activations' dtype (exactly: |q| ≤ 127), rather than by ``_weight_int8pack_mm``, whose cost
#: grows with the rows while converting q costs the same at any count: per activation dtype, for a
#: matrix of at most ``INT8_SMALL`` weights (its converted copy stays in the caches) and for a larger
#: one (a head: converted at memory speed). ``bench/int4_rows.py --weights int8`` at SmolLM2's shapes
#: (docs/benchmarks.md): with bf16 activations (AVX-512) the float product is the faster from 16–48 rows
#: (the head from 128; 5.8× at 505 rows), with float32 ones (AVX2) from 1 row (the head from 8).
INT8_FLOAT_ROWS = {torch.bfloat16: (32, 128), torch.float32: (1, 8)}
INT8_SMALL = 1 << 22


def int8_float_rows(activations: torch.dtype, weights: int) -> int:
    """The rows from which an int8 matrix of ``weights`` weights is multiplied by the float kernels."""
    small, large = INT8_FLOAT_ROWS.get(activations, INT8_FLOAT_ROWS[torch.float32])
    return small if weights <= INT8_SMALL else large


# (torch leaves it unannotated)
mkldnn_available: Callable[[], bool] = torch.backends.mkldnn.is_available


def onednn_bf16() -> bool:
    """True where oneDNN can run bf16 matmuls on this CPU from prepacked weights."""
    try:
        return bool(
            mkldnn_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        )
    except (AttributeError, RuntimeError):
        return False


class InferenceLinear(nn.Module):
    """``y = x·Wᵀ + b``: one row on a CPU (a decode step) of a model that ``streams`` → ``gemv``;
    anything else → ``_matmul``.

    Subclasses hold ``weight`` (and ``scales`` for int8) in their storage format and say how
    to multiply many rows.
    """

    fmt = "fp32"
    streams = False  # use the one-row kernel: set by quantize() for models too large for the caches
    in_features: int
    out_features: int
    weight: torch.Tensor
    bias: torch.Tensor | None
    scales: torch.Tensor | None

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("scales", None)  # per-output-channel scales of an int8 weight

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        return F.linear(x2, self.weight.to(x2.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        one_row = x2.size(0) == 1 and x2.device.type == "cpu" and not torch.is_grad_enabled()
        kernel = _GEMV.get(self.weight.dtype) if one_row and self.streams else None
        if one_row and torch.compiler.is_compiling():  # a compiled decode step: its one-row product
            y = self._compiled_row(x2)
        elif kernel is not None and kernel.enabled:  # uncompiled, gemv would materialise (N, K) floats
            # plain tensors with no storage offset: dynamo then compiles one graph for every shape
            # (it specialises on a Parameter's shape and on an offset of x)
            bias = self.bias.detach() if self.bias is not None else None
            y = kernel(x2.contiguous(), self.weight.detach(), self.scales, bias)
        else:
            y = self._matmul(x2)
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def _compiled_row(self, x2: torch.Tensor) -> torch.Tensor:
        """One row inside a compiled decode step: ``gemv``, which joins the step's graph."""
        return gemv(x2, self.weight, self.scales, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}"


def one_row_compiled(model: nn.Module) -> bool:
    """Whether ``model``'s one-row products run through the compiled kernel: a CPU layer streams
    (``quantize`` marked it, where ``gptlab.hardware.one_row_kernel`` says ``compiled``) and its
    kernel is not switched off (no C++ compiler, ``configure(compile=False)``, a failed compilation)."""
    for m in model.modules():
        if isinstance(m, InferenceLinear) and m.streams and m.weight.device.type == "cpu":
            kernel = _GEMV.get(m.weight.dtype)
            if kernel is not None and kernel.enabled:
                return True
    return False


#: what an ``InferenceLinear`` is made from: an ``nn.Linear``, or a ``FloatLinear`` holding its parameters
Linear = nn.Linear | InferenceLinear


class FloatLinear(InferenceLinear):
    """Float weights: the original ``nn.Linear``'s own parameters, so ties and state_dict keys hold."""

    def __init__(self, linear: Linear) -> None:
        super().__init__(linear)
        self.weight, self.bias = linear.weight, linear.bias


class PackedBF16Linear(InferenceLinear):
    """bf16 weights; how many rows multiply is chosen per machine (``gptlab.hardware.Plan.bf16_matmul``):

    * ``packed``: through a copy reordered once into oneDNN's blocked layout, which lets a CPU's
      native bf16 kernels stream the weights for a handful of rows, where a plain bf16
      ``F.linear`` is compute-bound;
    * ``float32``: a CPU that only emulates bf16 multiplies ``x·float(W)ᵀ`` in float32 from
      ``UPCAST_MIN_ROWS`` rows on (fewer rows are bound by reading W, where bf16 is as fast);
    * ``plain``: ``F.linear`` in bf16 (a GPU).
    """

    fmt = "bf16"

    def __init__(self, linear: Linear) -> None:
        super().__init__(linear)
        w = linear.weight.detach().to(torch.bfloat16)
        self.register_buffer("weight", w, persistent=False)
        self.matmul = hardware.plan(device="cpu").bf16_matmul if w.device.type == "cpu" else "plain"
        if self.matmul == "packed" and not onednn_bf16():
            self.matmul = "plain"
        packed: torch.Tensor | None = (
            torch.ops.mkldnn._reorder_linear_weight(w, None) if self.matmul == "packed" else None
        )
        self.register_buffer("packed", packed, persistent=False)
        bias = linear.bias.detach().to(torch.bfloat16) if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x2.device.type == "cpu":
            x2 = x2.to(torch.bfloat16).contiguous()
            y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x2, self.packed, None, "none", [], "")
            return y
        if self.matmul == "float32" and x2.size(0) >= UPCAST_MIN_ROWS:
            return F.linear(x2.float(), self.weight.float()).to(x2.dtype)
        return F.linear(x2, self.weight.to(x2.dtype))


class Int8Linear(InferenceLinear):
    """``y = (x·qᵀ) ⊙ s + b`` with int8 ``q`` (out, in) and one scale per output channel."""

    fmt = "int8 per-channel"

    def __init__(self, linear: Linear, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(linear)
        q, scale = quantize_rows(linear.weight.detach())  # q (out, in), one s_o per output channel
        self.register_buffer("weight", q)
        self.scales = scale.squeeze(1).to(dtype)
        bias = linear.bias.detach().to(dtype) if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        assert self.scales is not None
        scales = self.scales.to(x2.dtype)
        if _FUSED and x2.device.type == "cpu" and x2.size(0) < int8_float_rows(x2.dtype, self.weight.numel()):
            y: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), self.weight, scales)
            return y
        return F.linear(x2, self.weight.to(x2.dtype)) * scales  # a prefill: the float kernels

    @property
    def library_row(self) -> bool:
        """Whether a compiled step multiplies this layer's one row by ``_weight_int8pack_mm``: it does not
        stream (bf16 is native) and computes in bf16 (its scales' dtype is the activations')."""
        return _FUSED and not self.streams and self.scales is not None and self.scales.dtype == torch.bfloat16

    def _compiled_row(self, x2: torch.Tensor) -> torch.Tensor:
        """One row inside a compiled decode step. With bf16 activations (native bf16, where the library
        kernels multiply a row) ``_matmul``'s ``_weight_int8pack_mm``, as the eager step runs it: inductor
        lowers it to its C++ GEMM template where the step freezes its weights (``gptlab.generate.one_token``,
        each matrix packed once into blocks of columns: the int8 products about twice as fast, SmolLM2's
        Q8_0 step 1.7× as fast), else to the library call. ``gemv`` with float32 ones, which that kernel
        is slow with (a CPU below native bf16)."""
        if not self.library_row or x2.dtype != torch.bfloat16:
            return super()._compiled_row(x2)
        y = self._matmul(x2)
        return y if self.bias is None else y + self.bias.to(y.dtype)


class Int8Embedding(nn.Module):
    """``e_x = q_x · s_x``: int8 rows ``q`` (V, d_model) and one scale per row ``s`` (V,), in ``s``'s dtype."""

    weight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the rows come out in (what ``GPT.dtype`` reports for a model with this table)."""
        return self.scales.dtype

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) → (B, T, d_model)
        return self.weight[idx].to(self.scales.dtype) * self.scales[idx].unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 per-row"


def int8_embedding(model: nn.Module, act: torch.dtype) -> None:
    """The token table as ``Int8Embedding``: the tied head's int8 matrix and scales, else its own."""
    wte, head = getattr(model, "wte", None), getattr(model, "lm_head", None)
    if not isinstance(wte, nn.Embedding):
        return
    config = getattr(model, "config", None)
    if getattr(config, "tie_embeddings", False) and isinstance(head, Int8Linear):
        assert head.scales is not None
        model.wte = Int8Embedding(head.weight, head.scales)
    else:
        q, scale = quantize_rows(wte.weight.detach())
        model.wte = Int8Embedding(q, scale.squeeze(1).to(act))


def activation_dtype(device: torch.device | str) -> torch.dtype:
    """What an int8 model computes in: bf16 where bf16 is native on ``device``, else float32.

    A model being built on the meta device (``gptlab.model.load_quantized``) is for the CPU.
    """
    kind = torch.device(device).type
    return torch.bfloat16 if hardware.native_bf16("cpu" if kind == "meta" else kind) else torch.float32


def quantize_rows(w: torch.Tensor, rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_int8`` of a matrix (N, K), ``rows`` rows at a time: the same q (N, K) int8 and s (N, 1)
    float32, without float temporaries of the whole matrix (four of them for a 49,152-row table)."""
    if w.size(0) <= rows:
        return quantize_int8(w)
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(w.size(0), 1, dtype=torch.float32, device=w.device)
    for i in range(0, w.size(0), rows):
        q[i : i + rows], scale[i : i + rows] = quantize_int8(w[i : i + rows])
    return q, scale


def cast_params(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast parameters (not buffers: positional tables stay float32) to ``dtype``."""
    for p in model.parameters():
        p.data = p.data.to(dtype)


def replace_linears(model: nn.Module, make: Callable[[Linear], nn.Module]) -> None:
    """Every ``nn.Linear`` (or ``FloatLinear``) of ``model`` replaced, in place, by ``make(linear)``."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear | FloatLinear):  # FloatLinear holds the float parameters
                setattr(module, child_name, make(child))
