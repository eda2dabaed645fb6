"""A GGUF file's metadata and tensor records, parsed in one pass over its header (``parse_gguf``).

A GGUF file is a header, then its tensors' bytes (llama.cpp's ``gguf.md``), all little-endian::

    magic "GGUF" · version u32 · tensor count u64 · key/value count u64
    per key/value:  key (string) · value type u32 · value
    per tensor:     name (string) · n_dims u32 · dims u64 × n_dims (innermost first) · type u32 · offset u64
    padding to ``general.alignment`` (32 by default) · tensor data (each at data start + its offset)

where a string is a u64 byte count and UTF-8 bytes, and an array value is an element type u32, a
u64 count and the elements. This reads it as ``gguf.GGUFReader`` does (the same fields, values,
tensor types, shapes and memory-mapped data; ``tests/interop/test_gguf_file.py`` checks the two
against each other), with one ``struct`` call per value instead of NumPy views per element:
a model's vocabulary is ~100,000 strings, which took ``GGUFReader`` 1.8 s for SmolLM2 and takes this
about 0.03 s (the strings read in one loop), at every start of a command that runs a GGUF file. An
array of strings is a ``StringTable`` (one block of bytes; it compares equal to the list of them).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptlab.tokenizers.string_table import StringTable

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
#: GGUF value type → struct format of one scalar (8: string, 9: array)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
_U64 = struct.Struct("<Q")
#: tensor types stored as plain numbers (NumPy dtype); every other type is blocks of bytes
PLAIN = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


@dataclass(frozen=True)
class TensorRecord:
    """One tensor of a GGUF file: name, ``gguf.GGMLQuantizationType``, dims (innermost first, as the file
    lists them) and its data, a view of the memory map: (rows…, elements) for plain types, (rows…,
    bytes per row) of uint8 for block types (``gguf.quants`` reads either)."""

    name: str
    tensor_type: Any
    shape: np.ndarray
    data: np.ndarray


class _Header:
    """A cursor over the header's bytes."""

    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.buf, self.at)[0]
        self.at += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        end = self.at + n
        if end > len(self.buf):
            raise ValueError(f"a string of {n} bytes runs past the end of the file")
        text = str(self.buf[self.at : end], "utf-8")
        self.at = end
        return text

    def strings(self, count: int) -> StringTable:
        """``count`` strings in a row (a vocabulary's tokens or merges), read in one loop into one block of
        bytes (``StringTable``: ~1 MB for SmolLM2's 98,000, where as ``str`` objects they held 8.3 MB)."""
        buf, at, size = self.buf, self.at, len(self.buf)
        data, starts = bytearray(), array("Q", [0])
        length = _U64.unpack_from
        for _ in range(count):
            (n,) = length(buf, at)
            at += 8
            end = at + n
            if end > size:
                raise ValueError(f"a string of {n} bytes runs past the end of the file")
            data += buf[at:end]
            starts.append(len(data))
            at = end
        self.at = at
        return StringTable(bytes(data), starts)

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item == STRING:
                return self.strings(count)
            if item == ARRAY:
                return [self.value(self.take("I")) for _ in range(count)]
            fmt = SCALARS[item]
            values = struct.unpack_from(f"<{count}{fmt}", self.buf, self.at)
            self.at += count * struct.calcsize(fmt)
            return list(values)
        return self.take(SCALARS[kind])


def parse_gguf(path: Path) -> tuple[dict[str, Any], list[TensorRecord]]:
    """``(fields, tensors)`` of a GGUF file: every metadata value as Python values (``GGUF.version``,
    ``GGUF.tensor_count`` and ``GGUF.kv_count`` first, as ``GGUFReader`` lists them) and every tensor's
    record. Raises ``ValueError``, ``KeyError``, ``IndexError`` or ``struct.error`` on a malformed file
    (``read_gguf`` turns each into one ``GptlabError``)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    data = np.memmap(path, mode="r").view(np.ndarray)  # plain views: memmap slicing runs Python per slice
    head = _Header(memoryview(data))  # type: ignore[arg-type]  # a uint8 array exposes the buffer protocol
    if bytes(data[:4]) != MAGIC:
        raise ValueError("GGUF magic invalid")
    head.at = 4
    version = head.take("I")
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} (a big-endian file, or one newer than this reader)")
    n_tensors, n_kv = head.take("Q"), head.take("Q")
    fields: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}
    for _ in range(n_kv):
        key = head.string()
        if key in fields:
            raise KeyError(f"duplicate key {key}")
        fields[key] = head.value(head.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = head.string()
        dims = np.array([head.take("Q") for _ in range(head.take("I"))], dtype=np.uint64)
        infos.append((name, GGMLQuantizationType(head.take("I")), dims, head.take("Q")))
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment!r} is not a power of two")
    start = -(-head.at // alignment) * alignment
    tensors, names = [], set()
    for name, kind, dims, offset in infos:
        if name in names:
            raise ValueError(f"duplicated tensor {name}")
        names.add(name)
        shape = tuple(int(n) for n in reversed(dims.tolist()))
        count = int(np.prod(shape))
        block, size = GGML_QUANT_SIZES[kind]
        plain = PLAIN.get(int(kind))
        item, n_items = (plain, count) if plain is not None else (np.uint8, count * size // block)
        if plain is None:
            shape = quant_shape_to_byte_shape(shape, kind)
        first = start + int(offset)
        nbytes = n_items * np.dtype(item).itemsize
        if first + nbytes > data.size:
            raise ValueError(f"tensor {name} runs past the end of the file")
        tensors.append(TensorRecord(name, kind, dims, data[first : first + nbytes].view(item).reshape(shape)))
    return fields, tensors
