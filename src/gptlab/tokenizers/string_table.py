"""A vocabulary's strings held as one block of UTF-8 bytes: ``StringTable``.

A pretrained vocabulary is some 100,000 short strings (its tokens and its merges). As Python ``str``
objects they take ~87 bytes each for SmolLM2's (most hold GPT-2's ``Ġ``, U+0120, which makes CPython
store two bytes a character, behind a header of ~74): 8.3 MB held as long as the tokenizer lives,
and the interpreter's memory pools keep the pages of those freed among those kept. Held back to
back as their UTF-8, with where each one starts, they take what the file does (~1 MB); a string is
decoded when it is read.

    >>> t = StringTable.of(["Ġthe", "a b", ""])
    >>> len(t), t[0], list(t), t == ["Ġthe", "a b", ""]
    (3, 'Ġthe', ['Ġthe', 'a b', ''], True)
"""

from __future__ import annotations

import functools
import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import overload

_utf8 = functools.partial(str, encoding="utf-8")


class StringTable(Sequence[str]):
    """``n`` strings: string ``i`` is ``data[starts[i]:starts[i + 1]]`` decoded as UTF-8 (``starts``, an
    ``array("Q")``, holds ``n + 1`` rising offsets, the first 0, the last ``len(data)``). Compares equal
    to any sequence of the same strings; read-only."""

    __slots__ = ("_data", "_starts")

    def __init__(self, data: bytes, starts: array[int]) -> None:
        if starts.typecode != "Q" or len(starts) < 1 or starts[0] != 0 or starts[-1] != len(data):
            raise ValueError("a string table's offsets must run from 0 to the end of its bytes")
        if not _whole_characters(data, starts):
            raise ValueError("a string table's bytes are not whole UTF-8 strings")
        self._data, self._starts = data, starts

    @classmethod
    def of(cls, strings: Iterable[str]) -> StringTable:
        """The table of ``strings`` (each a ``str``)."""
        data, starts = bytearray(), array("Q", [0])
        for s in strings:
            data += s.encode("utf-8")
            starts.append(len(data))
        return cls(bytes(data), starts)

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("string table index out of range")
        i %= n
        return str(self._data[self._starts[i] : self._starts[i + 1]], "utf-8")

    def __iter__(self) -> Iterator[str]:
        # in C: each string's slice of a view (no copy), decoded (a generator took twice as long)
        view, starts = memoryview(self._data), self._starts
        return map(_utf8, map(view.__getitem__, map(slice, starts, islice(starts, 1, None))))

    @property
    def data(self) -> bytes:
        """Every string's UTF-8, back to back."""
        return self._data

    @property
    def starts(self) -> array[int]:
        """Where each string starts in ``data``, and its end last (``len(self) + 1`` offsets)."""
        return self._starts

    def joined(self) -> str:
        """Every string back to back (``"".join(self)``, in one decoding)."""
        return str(self._data, "utf-8")

    def char_starts(self) -> array[int]:
        """Where each string starts in ``joined()``, counted in characters, and its end last: the
        characters before byte ``i`` are the bytes before it that do not continue one (``10xxxxxx``).
        (An array, not a list: 100,000 int objects made at once would stay as holes in the interpreter's
        memory pools among the objects made while they lived.)"""
        import numpy as np  # (the package imports without it; here it counts 1 MB at once)

        begins = (np.frombuffer(self._data, np.uint8) & 0xC0) != 0x80
        before = np.concatenate([np.zeros(1, np.uint64), np.cumsum(begins, dtype=np.uint64)])
        return array("Q", before[np.frombuffer(self._starts, np.uint64)].tobytes())

    def all_split_once(self, byte: int) -> bool:
        """Whether each string holds ``byte`` once, neither first nor last (``"left right"``: two parts)."""
        import numpy as np

        data, starts = np.frombuffer(self._data, np.uint8), np.frombuffer(self._starts, np.uint64)
        if len(self) == 0:
            return True
        hits = np.concatenate([[0], np.cumsum(data == byte)])[starts]
        return bool(
            (hits[1:] - hits[:-1] == 1).all()  # (so no string is empty, and the indexing below is safe)
            and (data[starts[:-1]] != byte).all()
            and (data[starts[1:] - 1] != byte).all()
        )

    def has_empty(self) -> bool:
        """Whether some string is empty (two equal offsets), decoding none of them."""
        starts = self._starts
        return any(map(operator.eq, starts, islice(starts, 1, None)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringTable):
            return self._data == other._data and self._starts == other._starts
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable as they are

    def __repr__(self) -> str:
        return f"StringTable({len(self)} strings, {len(self._data):,} bytes)"


def _whole_characters(data: bytes, starts: array[int]) -> bool:
    """Whether every string is valid UTF-8 on its own: the offsets rise, the whole decodes, and no
    string begins inside a character (with a continuation byte, ``10xxxxxx``), which also rules out
    one ending inside one."""
    import numpy as np

    at = np.frombuffer(starts, np.uint64)
    if (at[1:] < at[:-1]).any():
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    first = np.frombuffer(data, np.uint8)[at[at < len(data)]]
    return bool(((first & 0xC0) != 0x80).all())


__all__ = ["StringTable"]
