"""Character-level tokenizer: one id per distinct character of a corpus.

The simplest instance of the blueprint's stage-1 map T: Σ* -> {0..V-1}*, with
Σ the corpus's characters (sorted by code point) and V = |Σ| (+ unk, + specials).

    >>> tok = CharTokenizer.from_text("hello world")
    >>> tok.vocab_size, tok.encode("hold")
    (8, [3, 5, 4, 1])
    >>> tok.decode([3, 5, 4, 1])
    'hold'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gptlab.errors import GptlabError
from gptlab.tokenizers.base import Tokenizer, as_id_list, check_special_tokens, check_text, join_ids


def _strip_specials(text: str, special_tokens: Sequence[str]) -> str:
    """Remove special-token strings: they become tokens, not characters."""
    for s in special_tokens:
        text = text.replace(s, "")
    return text


class CharTokenizer(Tokenizer):
    """Maps each character to its index in a sorted alphabet.

    A character outside the alphabet is a ``GptlabError`` naming it and its
    position, unless the tokenizer has an ``unk`` token, which then stands for it.
    """

    kind = "char"

    def __init__(
        self, chars: Sequence[str], unk: str | None = None, special_tokens: Mapping[str, int] | None = None
    ):
        chars = list(chars)
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise GptlabError(f"a CharTokenizer vocabulary entry must be one character, got {c!r}")
            check_text(c)
        if len(set(chars)) != len(chars):
            raise GptlabError("the CharTokenizer vocabulary has a repeated character")
        pieces = list(chars)
        if unk is not None:
            if not isinstance(unk, str) or not unk:
                raise GptlabError(f"unk must be a non-empty string, got {unk!r}")
            check_text(unk)
            if unk not in pieces:
                pieces.append(unk)
        super().__init__(check_special_tokens(special_tokens or {}, reserved=len(pieces)))
        if unk is not None and unk in self.special_tokens:
            raise GptlabError(f"unk {unk!r} cannot also be a special token")
        self.chars = chars
        self.unk = unk
        self.unk_id = pieces.index(unk) if unk is not None else None
        self._stoi = {c: i for i, c in enumerate(chars)}
        self._itos: dict[int, str] = dict(enumerate(pieces))
        self._itos.update({i: s for s, i in self.special_tokens.items()})
        self._set_decoder({i: s.encode("utf-8") for i, s in self._itos.items()})
        self._str_table = [self._itos.get(i) for i in range(self.vocab_size)]

    @classmethod
    def from_text(
        cls, text: str, unk: str | None = None, special_tokens: Sequence[str] = ()
    ) -> CharTokenizer:
        """Build the alphabet of ``text``; special tokens get the ids after it.

        Occurrences of the special-token strings in ``text`` are not counted as
        characters. ``unk`` (e.g. ``"?"`` or ``"<unk>"``) stands for unseen characters.

        >>> CharTokenizer.from_text("abca", special_tokens=["<|endoftext|>"]).special_tokens
        {'<|endoftext|>': 3}
        """
        text = check_text(text)
        if isinstance(special_tokens, str):
            special_tokens = [special_tokens]
        chars = sorted(set(_strip_specials(text, special_tokens)))
        if not chars:
            raise GptlabError("the corpus is empty; a CharTokenizer needs at least one character of text")
        n = len(chars) + (1 if unk is not None and unk not in chars else 0)
        specials = {s: n + i for i, s in enumerate(dict.fromkeys(special_tokens))}
        return cls(chars, unk=unk, special_tokens=specials)

    def _encode_ordinary(self, text: str) -> list[int]:
        stoi = self._stoi
        try:
            return list(map(stoi.__getitem__, text))
        except KeyError:
            pass
        if self.unk_id is None:
            position, char = next((i, c) for i, c in enumerate(text) if c not in stoi)
            raise GptlabError(
                f"the text has the character {char!r} at position {position}, which is not in the vocabulary; "
                "rebuild the tokenizer from a corpus that has it, or pass unk=... to CharTokenizer.from_text"
            ) from None
        unk_id = self.unk_id
        return [stoi.get(c, unk_id) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text (faster than joining bytes: the pieces are already ``str``)."""
        return join_ids("", self._str_table, as_id_list(ids), self._bad_id)

    def _payload(self) -> dict[str, Any]:
        return {"chars": self.chars, "unk": self.unk}

    @classmethod
    def _from_payload(cls, d: Mapping[str, Any], special_tokens: dict[str, int]) -> CharTokenizer:
        chars = d["chars"]
        if not isinstance(chars, list):
            raise GptlabError(f"'chars' must be a list of characters, got {type(chars).__name__}")
        return cls(chars, unk=d.get("unk"), special_tokens=special_tokens)
