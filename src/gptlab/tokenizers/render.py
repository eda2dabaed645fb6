"""Printable renderings of tokens for ``gptlab tokenizer show`` and traces.

Control and other invisible characters are escaped, bytes that are not UTF-8 on
their own (half of a multi-byte character) are shown as ``\\xNN``:

    >>> render_token(b" the\\n")
    ' the\\\\n'
    >>> render_token(b"\\xe2\\x82")
    '\\\\xe2\\\\x82'
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

from gptlab.errors import GptlabError
from gptlab.tokenizers.base import Tokenizer

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _render_char(c: str) -> str:
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 on its own (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if c in _NAMED:
        return _NAMED[c]
    if unicodedata.category(c)[0] in "CZ" and c != " ":  # controls, format, separators, unassigned
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return c


def render_token(data: bytes) -> str:
    """One token's bytes as a single printable line."""
    return "".join(map(_render_char, data.decode("utf-8", errors="surrogateescape")))


def vocab_lines(tok: Tokenizer, start: int = 0, limit: int | None = None) -> Iterator[str]:
    """``"id<TAB>token"`` lines, special tokens marked ``(special)``."""
    specials = {i: s for s, i in tok.special_tokens.items()}
    stop = tok.vocab_size if limit is None else min(tok.vocab_size, start + limit)
    for i in range(max(start, 0), stop):
        if i in specials:
            yield f"{i}\t{specials[i]}\t(special)"
            continue
        try:
            yield f"{i}\t{render_token(tok.token_bytes(i))}"
        except GptlabError:  # a gap in the ids
            continue
