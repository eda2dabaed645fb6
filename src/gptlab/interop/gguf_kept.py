"""A GGUF file's weights kept as it ships them (``from_gguf_kept(path, "keep" | "int4")``, ``gptlab.load``).

Q4_0 and Q4_1 blocks become ``Int4Linear`` layers without a float copy (``int4_parts``: the block's
``d``, ``m`` and nibbles as PyTorch's ``w = (q − 8)·s + z``); a token table in Q4_0/Q4_1 stays int4 the
same way (``Int4Embedding``, a tied head multiplying the same bytes), one in Q8_0 keeps its blocks as
two int4 planes (``q8_0_planes``: ``q = 16·h + l``, each block's scale carried over), any other becomes
int8 rows a block of rows at a time (``int8_rows``); Q8_0 matrices keep their blocks as planes too
where ``gptlab.hardware.int8_blocks`` says so (below native bf16); every other matrix is dequantized
and made int8 (``keep``) or int4 (``int4``) by ``gptlab.model.load_quantized.build_quantized``, tensor
by tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptlab.interop.gguf import (
    DEQUANTIZE_ROWS,
    GgufArchitecture,
    GgufFile,
    dequantize,
    from_gguf,
    gguf_config,
    hf_state,
    read_gguf,
)
from gptlab.model import GPT, GPTConfig, build_empty
from gptlab.model.int4 import Int4Parts, int4_supported, q8_planes

#: GGUF block types that become ``Int4Linear`` as they are: bytes per block of 32 weights
INT4_BLOCKS = {"Q4_0": 18, "Q4_1": 20}
#: tensor types that are plain floats (a file of only these loads as float weights under ``keep``)
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def int4_parts(record: Any) -> Int4Parts:
    """A Q4_0 or Q4_1 tensor's blocks as ``w = (q − 8)·s + z`` (``Int4Parts``, PyTorch's (N, K) order).

    A block of 32 weights is an fp16 ``d`` (and, Q4_1, an fp16 ``m``) then 16 bytes: byte ``j`` holds
    ``q_j`` in its low nibble and ``q_{j+16}`` in its high one. Q4_0 is ``w = d·(q − 8)``: ``s = d``,
    ``z = 0``; Q4_1 is ``w = d·q + m``: ``s = d``, ``z = m + 8d`` (float32: exact but where m and 8d
    lie more than 2¹³ apart).
    """
    kind = record.tensor_type.name
    size = INT4_BLOCKS[kind]
    n = record.data.shape[0]
    blocks = _bytes(record.data).view(n, -1, size)  # torch: the unpacking runs on every core
    d = _fp16(blocks[..., 0:2])
    if kind == "Q4_1":
        qs, z = blocks[..., 4:], _fp16(blocks[..., 2:4]) + 8 * d
    else:
        qs, z = blocks[..., 2:], torch.zeros_like(d)
    q = torch.cat([qs & 15, qs >> 4], dim=-1).reshape(n, -1)
    return Int4Parts(q, d, z)


def _bytes(data: np.ndarray) -> torch.Tensor:
    """A record's bytes (a read-only view of the file) as a uint8 tensor of their own."""
    return torch.from_numpy(np.array(data, dtype=np.uint8, copy=True))


def _fp16(pairs: torch.Tensor) -> torch.Tensor:
    """(…, 2) little-endian bytes → the fp16 numbers they hold, as float32 (…)."""
    return pairs.contiguous().view(torch.float16)[..., 0].float()


def q8_0_planes(record: Any) -> Int4Parts:
    """A Q8_0 matrix (N, K) as one int4 matrix (N, 2K) of its two planes (``q8_planes``): a block of 32
    weights is an fp16 ``d`` and 32 int8 ``q``, ``w = d·q``, and each block keeps its own ``d``."""
    n, width = record.data.shape
    k = width // 34 * 32
    out = Int4Parts(
        torch.empty(n, 2 * k, dtype=torch.uint8),
        torch.empty(n, 2 * k // 32, dtype=torch.float32),
        torch.empty(n, 2 * k // 32, dtype=torch.float32),
        planes=2,
    )
    for i in range(0, n, DEQUANTIZE_ROWS):  # a block of rows at a time: no whole-table temporaries
        blocks = _bytes(record.data[i : i + DEQUANTIZE_ROWS]).view(-1, width // 34, 34)
        q = blocks[..., 2:].contiguous().view(torch.int8).reshape(blocks.size(0), -1)
        part = q8_planes(q, _fp16(blocks[..., 0:2]))
        rows = slice(i, i + blocks.size(0))
        out.q[rows], out.scales[rows], out.zeros[rows] = part.q, part.scales, part.zeros
    return out


def q8_0_rows(record: Any, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of a Q8_0 matrix as float32: a block of 32 weights is an fp16 ``d`` and 32
    int8 ``q``, ``w = d·q`` (the product ``gguf.quants.dequantize`` computes, in float32, on every core)."""
    blocks = _bytes(record.data[start:stop])
    blocks = blocks.view(blocks.size(0), -1, 34)
    w = blocks[..., 2:].contiguous().view(torch.int8).float() * _fp16(blocks[..., 0:2])[..., None]
    return w.reshape(blocks.size(0), -1)


def _fixed_parts(
    arch: GgufArchitecture,
    hf: dict[str, Any],
    records: list[tuple[str, Any]],
    read: Callable[[Any], Int4Parts] = int4_parts,
) -> Int4Parts:
    """The parts of HF tensors (name, record) with the architecture's row fixes, stacked by rows (q | k | v);
    ``read`` makes one record's parts (``q8_0_planes`` for a Q8_0 table)."""
    pieces = []
    for name, record in records:
        p = read(record)
        fixes = [fix for pattern, fix in arch.fixes if re.fullmatch(pattern, name)]
        if not fixes and len(records) == 1:
            return p  # as read: no copy (a token table's parts are tens of MB)
        arrays = [p.q.numpy(), p.scales.numpy(), p.zeros.numpy()]
        for fix in fixes:
            arrays = [np.ascontiguousarray(fix(a, hf)) for a in arrays]
        pieces.append(arrays)
    q, s, z = (torch.from_numpy(np.concatenate([a[i] for a in pieces])) for i in range(3))
    return Int4Parts(q, s, z, p.planes)


def kept_layers(
    f: GgufFile,
    arch: GgufArchitecture,
    hf: dict[str, Any],
    config: Any,
    shapes: GPT | None = None,
    q8_0_as_planes: bool = False,
) -> tuple[dict[str, Callable[[], Int4Parts]], list[str]]:
    """Which of the model's matrices keep the file's blocks, and which are made int8 per output channel.

    Returns (linear path → its ``Int4Parts``, read when called) for each matrix whose tensors are all
    Q4_0/Q4_1, or all Q8_0 where ``q8_0_as_planes`` (two int4 planes of its blocks, ``q8_0_planes``;
    ``gptlab.hardware.int8_blocks`` decides), and whose shape the int4 kernel takes (the rows of q, k and
    v stack into gptlab's fused ``qkv``), and the paths of the other matrices (int8 per output channel).
    Architectures whose layout fixes are not row moves (GPT-2's transposes) keep none. ``shapes``: the
    model built on the meta device, if the caller has it.
    """
    from gptlab.interop.common import COPY, FUSE_QKV

    meta = shapes if shapes is not None else build_empty(config, "meta")
    linears = {p: m for p, m in meta.named_modules() if isinstance(m, torch.nn.Linear)}
    records = {arch.hf_name(t.name): t for t in f.tensors}
    int4: dict[str, Callable[[], Int4Parts]] = {}
    for r in arch.family.all_rules(config):
        path = r.ours.removesuffix(".weight")
        if path not in linears or not r.ours.endswith(".weight") or not all(t in records for t in r.theirs):
            continue
        theirs = [(t, records[t]) for t in r.theirs]
        linear = linears[path]
        kinds = {rec.tensor_type.name for _, rec in theirs}
        planes = 2 if q8_0_as_planes and kinds == {"Q8_0"} else 1
        if (
            arch.rows_only
            and r.transform in (COPY, FUSE_QKV)
            and (kinds <= INT4_BLOCKS.keys() or planes == 2)
            and int4_supported(linear.out_features, linear.in_features * planes)
        ):
            int4[path] = partial(_fixed_parts, arch, hf, theirs, q8_0_planes if planes == 2 else int4_parts)
    return int4, [p for p in linears if p not in int4]


def int8_rows(record: Any, source: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """A (token table) tensor as int8 rows and one scale per row (``quantize_int8``: ``s = max|w|/127``),
    dequantized ``DEQUANTIZE_ROWS`` rows at a time: the same values as quantizing the float tensor,
    without it (SmolLM2's table: 113 MB in float32, 28 MB in int8)."""
    from gptlab.model.kvcache import quantize_int8

    shape = tuple(int(n) for n in reversed(record.shape.tolist()))
    q = torch.empty(shape, dtype=torch.int8)
    scales = torch.empty(shape[0], dtype=torch.float32)
    for i in range(0, shape[0], DEQUANTIZE_ROWS):
        if record.tensor_type.name == "Q8_0":
            floats = q8_0_rows(record, i, i + DEQUANTIZE_ROWS)
        else:
            floats = torch.from_numpy(dequantize(_RowsOf(record, i, i + DEQUANTIZE_ROWS), source))
        rows, s = quantize_int8(floats)
        q[i : i + rows.size(0)], scales[i : i + rows.size(0)] = rows, s[:, 0]
    return q, scales


class _RowsOf:
    """Rows ``start:stop`` of a 2-D tensor record, as ``dequantize`` reads a record."""

    def __init__(self, record: Any, start: int, stop: int) -> None:
        self.data = record.data[start:stop]
        self.tensor_type, self.name = record.tensor_type, record.name
        self.shape = np.array([record.shape[0], self.data.shape[0]])


def kept_model(
    f: GgufFile, arch: GgufArchitecture, hf: dict[str, Any], config: GPTConfig, quantize: str
) -> tuple[GPT | None, str | None]:
    """(the model kept as it ships, None) — or, under ``keep`` for a file with no matrix kept as its blocks
    (none in Q4_0/Q4_1, nor in Q8_0 where those are kept as planes), (None, the format to load it in
    instead: ``int8`` where its matrices are quantized, None for float)."""
    from gptlab.hardware import int8_blocks
    from gptlab.interop.common import import_lazy
    from gptlab.model.load_quantized import build_quantized
    from gptlab.model.state_dict import model_state

    meta = build_empty(config, "meta")  # shapes only
    int4, others = kept_layers(
        f, arch, hf, config, meta, quantize == "keep" and int8_blocks("cpu") == "planes"
    )
    if quantize == "keep" and not int4:
        quantized = any(t.tensor_type.name not in FLOAT_TYPES for t in f.tensors if len(t.shape) == 2)
        return None, "int8" if quantized else None
    shapes = model_state(meta)
    lazy = import_lazy(arch.family, config, hf_state(f, arch, hf), shapes, f.path)
    int8 = others if quantize == "keep" else ()
    embd = next(t for t in f.tensors if t.name == "token_embd.weight")
    table: Callable[[], tuple[torch.Tensor, torch.Tensor] | Int4Parts] | None = None
    kind, named = embd.tensor_type.name, [(arch.hf_name(embd.name) or embd.name, embd)]
    if len(embd.shape) == 2 and arch.rows_only and kind in (*INT4_BLOCKS, "Q8_0"):
        planes = 2 if kind == "Q8_0" else 1
        if int4_supported(config.padded_vocab_size, config.n_embd * planes):  # kept as its blocks
            read = q8_0_planes if kind == "Q8_0" else int4_parts
            table = partial(_fixed_parts, arch, hf, named, read)
    if table is None and len(embd.shape) == 2:
        table = partial(int8_rows, embd, f.path)
    return build_quantized(config, lazy, "int4", f.path, int4=int4, int8=int8, table=table), None


def from_gguf_kept(path: str | Path | GgufFile, quantize: str = "keep") -> GPT:
    """A GGUF file's model with its weights as it ships them (``quantize="keep"``: Q4_0/Q4_1 matrices and
    token table int4 from their blocks, a Q8_0 table as two int4 planes of its blocks, the other
    quantized matrices and token table int8, a file of float tensors only float32) or with every matrix
    int4 (``"int4"``): what ``gptlab.load`` of a GGUF file gives."""
    f = read_gguf(path)
    arch, hf, config = gguf_config(f)
    model, fallback = kept_model(f, arch, hf, config, quantize)
    return model if model is not None else from_gguf(f, quantize=fallback)
