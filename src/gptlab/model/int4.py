"""int4 weights (``gptlab.quantize(model, "int4")``): ``w = (q − 8)·s + z`` in groups of ``INT4_GROUP`` = 32
inputs, multiplied by PyTorch's weight-only int4 CPU kernel (``_weight_int4pack_mm_for_cpu``).

``q ∈ [0, 15]``; one scale ``s`` and offset ``z`` per group of 32 inputs of an output channel, held as
the kernel reads them: (K/32, N, 2) bf16. From float weights the groups are asymmetric min/max
(``quantize_int4``); a GGUF file's Q4_0/Q4_1 blocks arrive as ``Int4Parts`` (``gptlab.interop.gguf``).
The output head and the token table of a model quantized from float weights stay int8 (``Int8Linear``,
``Int8Embedding``); a GGUF file's 4-bit token table stays int4 as it ships (``Int4Embedding``, and a
tied head multiplies the same bytes through the kernel). An int8 matrix in blocks of 32 (a GGUF file's
Q8_0 token table; its Q8_0 matrices below native bf16) is held as two int4 planes (``q8_planes``).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.errors import GptlabError
from gptlab.model.quantized import (
    InferenceLinear,
    Int8Embedding,
    Int8Linear,
    Linear,
    activation_dtype,
    cast_params,
    int8_embedding,
    replace_linears,
)

_INT4 = hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu") and hasattr(
    torch.ops.quantized, "int4mm_packed_weight_cpu"
)
#: inputs per int4 group (one s, z pair): a GGUF Q4 block's 32
INT4_GROUP = 32


@dataclass(frozen=True)
class Int4Parts:
    """An int4 matrix as ``w = (q − 8)·s + z``: ``q`` (N, K) uint8 in [0, 15]; ``scales`` and ``zeros``
    (N, K / ``INT4_GROUP``) float32, one pair per group of 32 inputs of an output channel. ``planes=2``:
    an int8 matrix of K/2 inputs in blocks of 32, as its two planes side by side (``q8_planes``)."""

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    planes: int = 1

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix (N, K) the parts stand for."""
        g = self.q.size(1) // self.scales.size(1)
        s, z = self.scales.repeat_interleave(g, 1), self.zeros.repeat_interleave(g, 1)
        return (self.q.float() - 8) * s + z


#: From this many rows an int4 matrix is dequantized to the activations' dtype and multiplied by the
#: float kernels, per activation dtype (``int4_dequant_rows``). The int4 kernel's cost grows with the
#: rows (~10× a bf16 GEMM's at 505 rows); dequantizing costs the same at any row count (0.4–0.8 ns a
#: weight). ``bench/int4_rows.py`` at SmolLM2's shapes: the dequantized product is the faster one from
#: 96 rows with bf16 activations (an AVX-512 CPU with native bf16), from 128 with float32 ones (AVX2)
#: (docs/benchmarks.md).
INT4_DEQUANT_ROWS = {torch.bfloat16: 96, torch.float32: 128}


def int4_dequant_rows(activations: torch.dtype) -> int:
    """The rows from which an int4 matrix is dequantized for the float kernels (``INT4_DEQUANT_ROWS``)."""
    return INT4_DEQUANT_ROWS.get(activations, INT4_DEQUANT_ROWS[torch.float32])


@functools.cache
def kernel_layout() -> tuple[int, bool]:
    """How ``_convert_weight_to_int4pack_for_cpu`` orders nibbles on this CPU kind: (rows per block,
    blocked). It packs the rows in blocks (64 with AVX-512, 32 with AVX2); in a ``blocked`` block, byte
    ``(k, j)`` holds rows ``j`` (low nibble) and ``j + B/2`` (high), else rows ``2j`` and ``2j + 1``; a last
    partial block is in pairs. Found once by packing a probe and reading it back each way."""
    probe = torch.randint(0, 16, (80, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    for layout in ((64, True), (32, True), (64, False), (32, False), (16, False)):
        if torch.equal(_unpack(packed, 80, 64, *layout).t().to(torch.int32), probe):
            return layout
    raise GptlabError("this torch packs int4 weights in a layout gptlab does not know")


def _unpack(packed: torch.Tensor, n: int, k: int, block: int, blocked: bool) -> torch.Tensor:
    """q transposed, (K, N) uint8, from the kernel's packed weight in the layout (``block``, ``blocked``):
    each block of rows is (K, block/2) bytes, so reading the blocks as (K, blocks, block/2) puts the
    inputs first and every nibble lands in its row's column without a transposing copy."""
    flat = packed.reshape(-1)
    full = n // block * block
    out = []
    if full:
        b = flat[: full * k // 2].view(full // block, k, block // 2).permute(1, 0, 2)  # (K, blocks, B/2)
        lo, hi = b & 15, b >> 4
        out.append((torch.cat([lo, hi], -1) if blocked else torch.stack([lo, hi], -1)).reshape(k, full))
    if n > full:
        b = flat[full * k // 2 :].view(k, (n - full) // 2)
        out.append(torch.stack([b & 15, b >> 4], -1).view(k, n - full))
    return torch.cat(out, 1) if len(out) > 1 else out[0]


def _repack(portable: torch.Tensor, block: int, blocked: bool) -> torch.Tensor:
    """``pack_nibbles``' (N, K/2) bytes → the kernel's packed weight in the layout (``block``,
    ``blocked``), byte for byte what ``_convert_weight_to_int4pack_for_cpu`` makes of q (``_unpack``'s
    inverse), without widening q to int32 or unpacking it first. Byte ``i`` of row ``r`` holds inputs
    ``2i`` (low) and ``2i + 1``; in a block, input ``k`` of rows ``a`` (low) and ``b`` (high) is one byte,
    so with ``A``, ``B`` the rows' portable bytes: inputs ``2i`` give ``(A & 15) | B << 4``, inputs ``2i + 1``
    give ``A >> 4 | (B & 0xF0)``, written input-major."""
    n, half = portable.shape
    full = n // block * block
    out = []

    def paired(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # (…, rows, K/2) each → (…, K/2, 2, rows)
        even, odd = (a & 15) | (b << 4), (a >> 4) | (b & 0xF0)
        return torch.stack([even, odd], -1).transpose(-3, -2).transpose(-2, -1)

    if full:
        rows = portable[:full].view(full // block, block, half)
        a, b = (rows[:, : block // 2], rows[:, block // 2 :]) if blocked else (rows[:, 0::2], rows[:, 1::2])
        out.append(paired(a, b).reshape(-1))  # (blocks, K, B/2)
    if n > full:
        tail = portable[full:]
        out.append(paired(tail[0::2], tail[1::2]).reshape(-1))  # (K, rows left / 2): in pairs
    return (torch.cat(out) if len(out) > 1 else out[0]).view(n, half)


def kernel_packed(q: torch.Tensor, rows: int = 4096) -> torch.Tensor:
    """q (N, K) in [0, 15] → the kernel's packed weight (N, K/2) (``_repack`` of ``pack_nibbles``), ``rows``
    rows at a time: the layout's blocks of rows are consecutive bytes, so each slice of whole blocks
    (the last one with the partial block) packs on its own, without temporaries of the whole matrix."""
    block, blocked = kernel_layout()
    rows = max(rows // block, 1) * block
    n, k = q.shape
    packed = torch.empty(n, k // 2, dtype=torch.uint8)
    for i in range(0, n, rows):
        stop = n if n - i < 2 * rows else i + rows  # the last slice takes the partial block
        packed[i:stop] = _repack(pack_nibbles(q[i:stop]), block, blocked)
        if stop == n:
            break
    return packed


def unpack_kernel_layout(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """q (N, K) uint8 from the int4 kernel's packed (N, K/2) weight (``kernel_layout``)."""
    return _unpack(packed, n, k, *kernel_layout()).t().contiguous()


def kernel_scales(parts: Int4Parts) -> torch.Tensor:
    """The parts' scales and zeros as the kernel reads them: (K/32, N, 2) bf16."""
    return torch.stack([parts.scales.t(), parts.zeros.t()], -1).to(torch.bfloat16).contiguous()


def q8_planes(q: torch.Tensor, d: torch.Tensor) -> Int4Parts:
    """An int8 matrix in blocks of 32 inputs, ``w = d·q`` (GGUF's Q8_0: q (N, K) int8, d (N, K/32)), as
    one int4 matrix of 2K inputs holding its two planes side by side: ``q = 16·h + l`` with ``h = q >> 4``
    in [−8, 7] and ``l = q & 15``, so ``w = (h + 8 − 8)·16d + (l − 8)·d + 8d``: the high plane is
    ``q₄ = h + 8``, ``s = 16d``, ``z = 0``, the low one ``q₄ = l``, ``s = d``, ``z = 8d``, and
    ``x·Wᵀ = [x, x]·[H | L]ᵀ``: every block's own scale, carried over (``planes = 2``)."""
    high, low = (q >> 4) + 8, q & 15
    nibbles = torch.cat([high, low], 1).to(torch.uint8)
    d = d.float()
    return Int4Parts(nibbles, torch.cat([16 * d, d], 1), torch.cat([torch.zeros_like(d), 8 * d], 1), planes=2)


def _groups_dequantized(
    packed: torch.Tensor, sz: torch.Tensor, n: int, k: int, layout: tuple[int, bool], dtype: torch.dtype
) -> torch.Tensor:
    """``Wᵀ`` (K, N) in ``dtype`` from the kernel's packed bytes (N, K/2) in ``layout`` and its (K/32, N, 2)
    scales and offsets, eagerly: one scale and offset row serves each group's 32 rows,
    ``Wᵀ[k] = (qᵀ[k] − 8)·s[k/32] + z[k/32]`` (one ``addcmul``; |q − 8| ≤ 8 and the bf16 scale make each
    product exact in the float arithmetic it is computed in). A 1536×576 matrix dequantises in 0.36 ms
    against 0.82 ms as (N, K) in five operations (docs/benchmarks.md)."""
    s = sz[..., 0].to(dtype).contiguous().view(k // INT4_GROUP, 1, n)  # rows of N, not every other
    z = sz[..., 1].to(dtype).contiguous().view(k // INT4_GROUP, 1, n)
    q = _unpack(packed, n, k, *layout).view(torch.int8).sub_(8)  # q − 8 (K, N)
    return torch.addcmul(z, q.view(k // INT4_GROUP, INT4_GROUP, n), s).view(k, n)


def _blocks_dequantized(
    packed: torch.Tensor, sz: torch.Tensor, n: int, k: int, block: int, dtype: torch.dtype
) -> torch.Tensor:
    """``_groups_dequantized``'s ``Wᵀ`` (K, N) as a compiled graph computes it fast: the same numbers
    (each weight ``(q − 8)·s + z`` computed in float32 and rounded once), written so that inductor's
    kernel reads every operand contiguously and is vectorized. Its input ``k`` of row ``j`` of a
    ``blocked`` layout's block ``c`` of ``B`` rows is byte ``(c, k, j mod B/2)``, the low nibble for
    ``j < B/2``: so the weights are made as (K/32, 32, blocks, 2, B/2), which is (K, N), nibble by nibble, and the
    scales and offsets, which the kernel keeps in pairs (K/32, N, 2), are first set apart into two
    rows each (one ``cat``: inductor makes it a buffer of its own). Read through the pairs' stride of
    2, inductor's kernel was scalar and several times slower than ATen's calls; this one is faster than
    they are (``python bench/int4_rows.py --dequantise``; docs/benchmarks.md, "A prompt's pass compiled
    ahead of time"). Eagerly, ``_groups_dequantized``'s calls are the faster."""
    groups, half = k // INT4_GROUP, block // 2
    apart = torch.cat([sz[..., 0], sz[..., 1]])  # (2·K/32, N): the scales, then the offsets
    s = apart[:groups].view(groups, 1, n // block, 2, half).float()
    z = apart[groups:].view(groups, 1, n // block, 2, half).float()
    b = packed.view(n // block, groups, INT4_GROUP, half).permute(1, 2, 0, 3).unsqueeze(3)
    q = torch.cat([b & 15, b >> 4], 3).float() - 8  # (K/32, 32, blocks, 2, B/2): rows j, then j + B/2
    return (q * s + z).to(dtype).view(k, n)


def _planes_dequantized(qt: torch.Tensor, sz: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """``W = q·d`` transposed, (K, N) in ``dtype``, from two planes' nibbles transposed (2K, N) and their
    (2K/32, N, 2) scales and zeros (``q8_planes``): ``q = 16·(h − 8) + l`` exactly in int16 and ``d`` the
    low plane's scale, so each weight is rounded once (|q| ≤ 128: exact in bf16)."""
    n = qt.size(1)
    q = (qt[:k].to(torch.int16) - 8) * 16 + qt[k:]
    d = sz[k // INT4_GROUP :, :, 0].to(dtype)  # (K/32, N)
    return (q.view(k // INT4_GROUP, INT4_GROUP, n).to(dtype) * d[:, None, :]).view(k, n)


def _planes_packed_dequantized(
    packed: torch.Tensor, sz: torch.Tensor, n: int, k: int, dtype: torch.dtype
) -> torch.Tensor:
    """``_planes_dequantized`` straight from the kernel's packed bytes (N, K) of two planes, (K, N) in
    ``dtype``, where the layout is ``blocked`` in whole blocks (else through ``_unpack``). In a block, an
    input's byte holds rows ``j`` (low nibble) and ``j + B/2`` (high) of a plane, and the high plane's
    input ``i`` and the low plane's ``K + i`` hold the same two rows, so each row's int8 ``q = 16·(h − 8) + l``
    is made from two bytes with the nibbles' sign tricks, in int8, without unpacking: with
    ``x = h_byte ^ 0x88``, ``16·(h − 8)`` is ``x << 4`` (the low row) or ``x & 0xF0`` (the high row), read
    as int8; 3× faster than unpacking the 2K inputs for float32 weights, 1.9× for bf16, the same bits."""
    block, blocked = kernel_layout()
    if not blocked or n % block:
        return _planes_dequantized(_unpack(packed, n, 2 * k, block, blocked), sz, k, dtype)
    b = packed.reshape(-1).view(n // block, 2 * k, block // 2).permute(1, 0, 2)  # (2K, blocks, B/2)
    high, low = b[:k], b[k:]
    x = high ^ 0x88
    rows_j = (x << 4).view(torch.int8) + (low & 15).view(torch.int8)
    rows_j_half = (x & 0xF0).view(torch.int8) + (low >> 4).view(torch.int8)
    q = torch.stack([rows_j, rows_j_half], 2).view(k // INT4_GROUP, INT4_GROUP, n)  # (K, blocks, 2, B/2)
    d = sz[k // INT4_GROUP :, :, 0].to(dtype)  # (K/32, N): the low plane's scale
    return q.to(dtype).mul_(d[:, None, :]).view(k, n)


def _row_bytes(
    rows: torch.Tensor, n: int, k: int, block: int, blocked: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where rows ``rows`` (T,) of an (N, K) matrix lie in the kernel's packed bytes (``kernel_layout``):
    (the flat byte offsets (T, K), each row's nibble shift (T, 1): 0 low, 4 high). In a full block of
    ``block`` rows, row ``j`` reads byte column ``j mod B/2`` (``blocked``: the high nibble from row
    B/2) or ``j // 2`` (pairs: the high nibble for odd rows), ``B/2`` bytes a input; a last partial
    block of ``L`` rows is in pairs, ``L/2`` bytes an input."""
    full = n // block * block
    half = block // 2
    tail = rows >= full
    b, j = rows // block, rows % block
    column = j % half if blocked else j // 2
    high = j >= half if blocked else j % 2 == 1
    start = b * (k * half) + column
    stride = torch.full_like(rows, half)
    if n > full:  # the partial block's rows
        t = rows - full
        start = torch.where(tail, full * k // 2 + t // 2, start)
        stride = torch.where(tail, torch.full_like(rows, (n - full) // 2), stride)
        high = torch.where(tail, t % 2 == 1, high)
    offsets = start[:, None] + torch.arange(k, device=rows.device)[None, :] * stride[:, None]
    return offsets, (high.to(torch.uint8) * 4)[:, None]


def int4_supported(out_features: int, in_features: int) -> bool:
    """True where torch has the CPU int4 kernel and it takes the shape (N a multiple of 16, K of 32)."""
    return _INT4 and out_features % 16 == 0 and in_features % INT4_GROUP == 0


def quantize_int4(w: torch.Tensor, group: int = INT4_GROUP) -> Int4Parts:
    """Asymmetric min/max groups of ``group`` inputs: ``s = (max − min)/15``, ``q = round((w − min)/s)``,
    ``z = min + 8s``, so ``w ≈ (q − 8)·s + z`` (a constant group has ``s = 0``: ``q = 0``, ``z = min``)."""
    n, k = w.shape
    g = w.detach().float().reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    s = (hi - lo) / 15
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = ((g - lo[..., None]) / safe[..., None]).round().clamp(0, 15).to(torch.uint8)
    return Int4Parts(q.reshape(n, k), s, lo + 8 * s)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """(N, K) values in [0, 15] → (N, K/2) uint8, input ``2j`` in the low nibble and ``2j + 1`` in the high:
    how an int4 matrix is stored in a checkpoint (the kernel's own layout depends on the CPU)."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``pack_nibbles``'s inverse: (N, K/2) uint8 → (N, K) uint8."""
    return torch.stack([packed & 15, packed >> 4], -1).reshape(packed.size(0), -1)


class Int4Linear(InferenceLinear):
    """``y = x·Wᵀ + b`` with ``W = (q − 8)·s + z`` in groups of 32 inputs (``Int4Parts``), through
    ``_weight_int4pack_mm_for_cpu``: the weight as the kernel packs it (a layout of the CPU kind, made
    at load), one (s, z) bf16 pair per group as the kernel reads them, x in bf16, y in x's dtype.

    Saved (``state_dict``) as ``weight``: the nibbles in ``pack_nibbles``' portable layout, and
    ``scales_and_zeros`` (K/32, N, 2) bf16. Only the CPU has this kernel here.
    """

    fmt = "int4 groups of 32"
    planes = 1  # 2: an int8 matrix as two int4 planes of its blocks (``q8_planes``)
    scales_and_zeros: torch.Tensor

    def __init__(
        self, linear: Linear, parts: Int4Parts | None = None, dtype: torch.dtype = torch.bfloat16
    ) -> None:
        super().__init__(linear)
        if parts is None:
            parts = quantize_int4(linear.weight.detach())
        n, k = self.out_features, self.in_features * parts.planes
        if not int4_supported(n, k):
            raise GptlabError(f"no int4 kernel for a {n}×{k} matrix (needs {n} % 16 == 0, {k} % 32 == 0)")
        if tuple(parts.q.shape) != (n, k) or tuple(parts.scales.shape) != (n, k // INT4_GROUP):
            raise GptlabError(f"int4 parts of shape {tuple(parts.q.shape)} for a {n}×{k} matrix")
        self._set_planes(parts.planes)
        self._hold(kernel_packed(parts.q), kernel_scales(parts))
        bias = linear.bias.detach().to(dtype) if linear.bias is not None and not linear.bias.is_meta else None
        self.register_buffer("bias", bias)

    def _set_planes(self, planes: int) -> None:
        self.planes = planes
        if planes == 2:
            self.fmt = "int8 blocks of 32 as two int4 planes"

    def _hold(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor) -> None:
        """Hold q already in the kernel's packed layout (N, K/2), and the (K/32, N, 2) scales and zeros."""
        self.register_buffer("weight", packed, persistent=False)
        self.register_buffer("scales_and_zeros", scales_and_zeros, persistent=False)
        # the group size as a tensor, as the kernel's tensor form takes it: a compiled step reads it
        # as this module's own buffer (an ahead-of-time package names it, so it loads from the model)
        self.register_buffer("group", torch.tensor(INT4_GROUP), persistent=False)
        self.layout = kernel_layout()  # found here, not while a compiled graph is traced

    def unpacked(self) -> torch.Tensor:
        """q (N, K) uint8, read back from the kernel's layout (``kernel_layout``); (N, 2K) for two planes."""
        return unpack_kernel_layout(self.weight, self.out_features, self.in_features * self.planes)

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """``W = (q − 8)·s + z`` (N, K) in ``dtype``, each weight rounded once from its exact value:
        what many rows multiply, as a transposed view of Wᵀ (K, N), the order the kernel's blocks of
        rows unpack in without a copy: eagerly ``_groups_dequantized``, in a compiled graph
        ``_blocks_dequantized`` (the same numbers; each is the faster where it runs)."""
        n, k = self.out_features, self.in_features
        sz = self.scales_and_zeros
        if self.planes == 2:
            return _planes_packed_dequantized(self.weight, sz, n, k, dtype).t()
        block, blocked = self.layout
        if torch.compiler.is_compiling() and blocked and n % block == 0:
            return _blocks_dequantized(self.weight, sz, n, k, block, dtype).t()
        return _groups_dequantized(self.weight, sz, n, k, self.layout, dtype).t()

    def parts(self) -> Int4Parts:
        """The matrix as held: q, and the bf16 scales and zeros widened to float32."""
        sz = self.scales_and_zeros.float()
        return Int4Parts(
            self.unpacked(), sz[..., 0].t().contiguous(), sz[..., 1].t().contiguous(), self.planes
        )

    @classmethod
    def from_packed(
        cls,
        weight: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        bias: torch.Tensor | None = None,
        planes: int = 1,
    ) -> Int4Linear:
        """The layer over q already in the kernel's layout (N, K/2) and (K/32, N, 2) bf16 scales and
        zeros, held as they are (not copied: a tied head shares its token table's); ``planes=2``: an
        int8 matrix of K/2 inputs as two planes (``q8_planes``)."""
        n, k = weight.size(0), weight.size(1) * 2 // planes
        with torch.device("meta"):
            shape = nn.Linear(k, n, bias=False)
        layer = cls.__new__(cls)
        InferenceLinear.__init__(layer, shape)
        layer._set_planes(planes)
        layer._hold(weight, scales_and_zeros)
        layer.register_buffer("bias", bias)
        return layer

    @classmethod
    def stored(
        cls,
        weight: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        planes: int = 1,
    ) -> Int4Linear:
        """The layer of a checkpoint: ``pack_nibbles`` output (N, K/2) and (K/32, N, 2) scales and zeros
        (``planes=2``: an int8 matrix of K/2 inputs as its two planes)."""
        packed = _repack(weight.contiguous(), *kernel_layout())
        sz = scales_and_zeros.to(torch.bfloat16).contiguous()
        return cls.from_packed(packed, sz, bias.to(dtype) if bias is not None else None, planes)

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        destination[prefix + "weight"] = pack_nibbles(self.unpacked())
        destination[prefix + "scales_and_zeros"] = self.scales_and_zeros
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)
        if x2.device.type != "cpu":
            raise GptlabError(
                "int4 weights run on the CPU (torch's int4 kernel for CUDA takes another layout)"
            )
        if x2.size(0) >= int4_dequant_rows(x2.dtype):  # a prefill: the kernel is compute-bound there
            y = F.linear(x2, self.dequantized(x2.dtype))
        else:
            sz = self.scales_and_zeros
            xk = x2.to(sz.dtype)
            xk = torch.cat([xk, xk], 1) if self.planes == 2 else xk.contiguous()  # [x, x]·[H | L]ᵀ
            y = torch.ops.quantized.int4mm_packed_weight_cpu(xk, self.weight, self.group, sz)
            y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)


class Int4Embedding(nn.Module):
    """``e_x = (q_x − 8)·s_x + z_x`` in groups of 32 of the row's ``d_model`` entries: a token table held
    as ``Int4Linear`` holds a matrix (the kernel's packed layout, (d/32, V, 2) bf16 scales and zeros),
    so a tied output head is an ``Int4Linear`` over the same bytes (``head``). A row is gathered from
    the packed bytes (``_row_bytes``) and computed as ``Int4Linear.dequantized`` computes it, in the
    activations' dtype ``dtype``: rows of the table and of the head's matrix are equal.

    Saved (``state_dict``) with the vocabulary first, as the other token tables are: ``weight`` the
    nibbles in ``pack_nibbles``' portable layout (V, d/2), ``scales`` and ``zeros`` (V, d/32) bf16.
    """

    weight: torch.Tensor
    scales_and_zeros: torch.Tensor

    def __init__(
        self, weight: torch.Tensor, scales_and_zeros: torch.Tensor, dtype: torch.dtype, planes: int = 1
    ) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.size(0), weight.size(1) * 2 // planes
        self.planes = planes
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("scales_and_zeros", scales_and_zeros, persistent=False)
        self.out_dtype = dtype
        self.layout = kernel_layout()  # found here, not while a compiled step is traced

    @classmethod
    def from_parts(cls, parts: Int4Parts, dtype: torch.dtype) -> Int4Embedding:
        """The table of ``Int4Parts`` (V, d) (two planes: (V, 2d), ``q8_planes``), packed in this CPU's
        kernel layout."""
        v, d = parts.q.shape
        if not int4_supported(v, d):
            raise GptlabError(
                f"no int4 kernel for a {v}×{d} token table (needs {v} % 16 == 0, {d} % 32 == 0)"
            )
        return cls(kernel_packed(parts.q), kernel_scales(parts), dtype, parts.planes)

    @classmethod
    def stored(
        cls,
        weight: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        dtype: torch.dtype,
        planes: int = 1,
    ) -> Int4Embedding:
        """The table of a checkpoint: ``pack_nibbles`` output (V, d/2), scales and zeros (V, d/32) (twice
        as wide for ``planes=2``)."""
        sz = torch.stack([scales.t(), zeros.t()], -1).to(torch.bfloat16).contiguous()
        return cls(_repack(weight.contiguous(), *kernel_layout()), sz, dtype, planes)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the rows come out in (what ``GPT.dtype`` reports for a model with this table)."""
        return self.out_dtype

    def head(self) -> Int4Linear:
        """The tied output head ``logits = h·W_eᵀ``: an ``Int4Linear`` over this table's own tensors."""
        return Int4Linear.from_packed(self.weight, self.scales_and_zeros, planes=self.planes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) → (B, T, d_model)
        v, d = self.num_embeddings, self.embedding_dim
        rows = idx.reshape(-1)
        offsets, shift = _row_bytes(rows, v, d * self.planes, *self.layout)
        q = (self.weight.reshape(-1)[offsets] >> shift) & 15  # (T, d), (T, 2d) for two planes
        if self.planes == 2:  # as Int4Linear.dequantized: q·d, rounded once
            sz2 = self.scales_and_zeros[:, rows]  # (2d/32, T, 2)
            return _planes_dequantized(q.t(), sz2, d, self.out_dtype).t().reshape(*idx.shape, d)
        sz = self.scales_and_zeros[:, rows].transpose(0, 1).to(self.out_dtype)  # (T, d/32, 2)
        q8 = q.view(torch.int8).sub(8).view(rows.numel(), d // INT4_GROUP, INT4_GROUP)
        e = torch.addcmul(sz[..., 1:], q8, sz[..., :1])  # as ``Int4Linear.dequantized``
        return e.reshape(*idx.shape, d)

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        v, d = self.num_embeddings, self.embedding_dim * self.planes
        destination[prefix + "weight"] = pack_nibbles(_unpack(self.weight, v, d, *self.layout).t())
        destination[prefix + "scales"] = self.scales_and_zeros[..., 0].t().contiguous()
        destination[prefix + "zeros"] = self.scales_and_zeros[..., 1].t().contiguous()

    def extra_repr(self) -> str:
        kind = "int8 blocks of 32 as two int4 planes" if self.planes == 2 else f"int4 groups of {INT4_GROUP}"
        return f"{self.num_embeddings}, {self.embedding_dim}, {kind}"


def _held(model: nn.Module) -> dict[str, int]:
    """How many matrix weights a quantized model holds in each format (a shared matrix counted once)."""
    counts: dict[str, int] = {}
    seen: set[int] = set()
    for m in model.modules():
        if isinstance(m, InferenceLinear | Int8Embedding | Int4Embedding) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            if isinstance(m, Int4Linear | Int4Embedding):
                kind = "int4" if m.planes == 1 else "int8"  # two planes: int8 blocks
            else:
                kind = "int8" if m.weight.dtype == torch.int8 else "float"
            if isinstance(m, InferenceLinear):
                n = m.out_features * m.in_features
            else:
                n = m.num_embeddings * m.embedding_dim
            counts[kind] = counts.get(kind, 0) + n
    return counts


def held_weights(model: nn.Module) -> str:
    """How many matrix weights a quantized model holds in each format: ``"…in int4, …in int8"``."""
    return ", ".join(f"{n:,} weights in {kind}" for kind, n in _held(model).items())


def held_format(model: nn.Module) -> str:
    """The inference format a model made of int4-kernel layers is named by (``model.quantization``):
    ``"int4"`` where it holds any 4-bit weights, else ``"int8"`` (int8 matrices per output channel, or
    in blocks as two int4 planes: a GGUF file's Q8_0 matrices, ``gptlab.hardware.int8_blocks``)."""
    return "int4" if "int4" in _held(model) else "int8"


def to_int4(model: nn.Module) -> None:
    """int4 matrices where the kernel takes their shape (else int8); the output head and the token
    table int8; activations, norms as ``_to_int8``'s. A layer already int4 or int8 stays as it is."""
    first = next(itertools.chain(model.parameters(), model.buffers()))
    act = activation_dtype(first.device)
    head = getattr(model, "lm_head", None)
    if isinstance(head, Linear) and not isinstance(head, Int4Linear | Int8Linear):
        model.lm_head = Int8Linear(head, act)

    def make(linear: Linear) -> nn.Module:
        if int4_supported(linear.out_features, linear.in_features):
            return Int4Linear(linear, dtype=act)
        return Int8Linear(linear, act)

    replace_linears(model, make)
    cast_params(model, act)
    int8_embedding(model, act)
