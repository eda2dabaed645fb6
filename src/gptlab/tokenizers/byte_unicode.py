"""GPT-2's reversible byte <-> printable-character table.

``vocab.bpe``, ``encoder.json`` and Hugging Face ``vocab.json``/``merges.txt``
write every token's bytes as printable characters: the 188 printable Latin-1
bytes stand for themselves and the other 68 bytes (controls, space, ...) are
shifted to U+0100 upwards, so the space byte is ``"Ġ"`` (U+0120).

    >>> token_to_bytes("Ġcat")
    b' cat'
    >>> bytes_to_token(b" cat")
    'Ġcat'
"""

from __future__ import annotations

from functools import lru_cache

from gptlab.errors import GptlabError


@lru_cache(maxsize=1)
def byte_to_char() -> dict[int, str]:
    """The table of openai/gpt-2 ``bytes_to_unicode``: ``{33: "!", ..., 32: "Ġ", ...}``."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


@lru_cache(maxsize=1)
def char_to_byte() -> dict[str, int]:
    """The inverse of ``byte_to_char``: ``{"Ġ": 32, ...}``."""
    return {c: b for b, c in byte_to_char().items()}


@lru_cache(maxsize=1)
def undo_table() -> dict[int, int | None]:
    """The ``str.translate`` table that undoes the alphabet: ``{ord("Ġ"): 32, ...}``; the Latin-1
    characters outside it map to None (deleted), so a shorter result means a foreign character."""
    table: dict[int, int | None] = {c: None for c in range(256)}
    table.update({ord(c): b for c, b in char_to_byte().items()})
    return table


def spelled_in_alphabet(token: str) -> bytes | None:
    """``"Ġcat" -> b" cat"``, or None when ``token`` has a character outside the table."""
    undone = token.translate(undo_table())
    if len(undone) != len(token):
        return None
    try:
        return undone.encode("latin-1")
    except UnicodeEncodeError:
        return None


def token_to_bytes(token: str) -> bytes:
    """``"Ġcat" -> b" cat"``; a character outside the table is a ``GptlabError``."""
    data = spelled_in_alphabet(token)
    if data is None:
        table = char_to_byte()
        bad = next(c for c in token if c not in table)
        raise GptlabError(f"token {token!r} has the character {bad!r}, which is not in GPT-2's byte table")
    return data


def bytes_to_token(data: bytes) -> str:
    """``b" cat" -> "Ġcat"``."""
    table = byte_to_char()
    return "".join(table[b] for b in data)
