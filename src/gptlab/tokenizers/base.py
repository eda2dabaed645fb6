"""The tokenizer base class: special tokens, decoding, JSON save and load.

Blueprint stage 1 ("Text to Tokens"): a tokenizer is the map

    T: Σ* -> {0, 1, ..., V-1}*

from text to a sequence of token ids, with ``decode`` its inverse on the image
of ``T`` (``decode(encode(s)) == s`` for every string ``s``).

Subclasses hold only the algorithm (karpathy/minbpe style): ``_encode_ordinary``
(text without special tokens -> ids), ``_payload``/``_from_payload`` (their part
of the JSON) and a call to ``_set_decoder`` ({id: token bytes}). This class adds
special-token handling, decoding, validation and the JSON format of every kind.

Special tokens (``"<|endoftext|>"``) are matched only where the caller allows
them; anywhere else their text is encoded as ordinary text, so a document that
happens to contain ``"<|endoftext|>"`` cannot inject an end-of-text id:

    >>> from gptlab.tokenizers import CharTokenizer
    >>> tok = CharTokenizer.from_text("<|>defnotx", special_tokens=["<|endoftext|>"])
    >>> tok.encode("<|endoftext|>", allowed_special="all") == [tok.eot_id]
    True
    >>> len(tok.encode("<|endoftext|>")), tok.eot_id in tok.encode("<|endoftext|>")
    (13, False)
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

FORMAT = "gptlab-tokenizer"
FORMAT_VERSION = 1
EOT = "<|endoftext|>"

# kind -> class; filled in by ``Tokenizer.__init_subclass__`` so that
# ``from_dict`` dispatches through a dict, never an if-chain.
KINDS: dict[str, type[Tokenizer]] = {}

AllowedSpecial = Literal["all"] | set[str] | frozenset[str]


def check_text(text: object) -> str:
    """Return ``text`` if it is a ``str`` that UTF-8 can encode, else raise ``GptlabError``.

    Lone surrogates (``"\\ud800"``) come from broken decoding upstream; they have
    no UTF-8 form, so they are rejected with their position.

    >>> check_text("héllo")
    'héllo'
    """
    if not isinstance(text, str):
        raise GptlabError(f"text to encode must be a str, got {type(text).__name__}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise GptlabError(
                f"the text has a lone surrogate {text[exc.start]!r} at position {exc.start}, which is not "
                "valid Unicode; decode the source with errors='replace' or fix it"
            ) from None
    return text


def check_special_tokens(special_tokens: Mapping[str, int], reserved: int) -> dict[str, int]:
    """Validate ``{text: id}``: non-empty strings, distinct ids >= ``reserved``."""
    if not isinstance(special_tokens, Mapping):
        raise GptlabError(
            f"special_tokens must be a mapping of token text to id, got {type(special_tokens).__name__}"
        )
    out: dict[str, int] = {}
    seen: dict[int, str] = {}
    for text, tid in special_tokens.items():
        if not isinstance(text, str) or not text:
            raise GptlabError(f"a special token must be a non-empty string, got {text!r}")
        check_text(text)
        if isinstance(tid, bool) or not isinstance(tid, int) or tid < reserved:
            raise GptlabError(
                f"special token {text!r} has id {tid!r}; it must be an int >= {reserved} (after the ordinary tokens)"
            )
        if tid in seen:
            raise GptlabError(f"special tokens {seen[tid]!r} and {text!r} share the id {tid}")
        seen[tid] = text
        out[text] = tid
    return out


def as_id_list(ids: Iterable[int]) -> list[int] | tuple[int, ...]:
    """Ids as a list: numpy arrays and torch tensors become plain ints (``tolist``).

    >>> as_id_list(iter([1, 2]))
    [1, 2]
    """
    if isinstance(ids, list | tuple):
        return ids
    tolist = getattr(ids, "tolist", None)
    if callable(tolist):
        listed = tolist()
        return listed if isinstance(listed, list) else [listed]
    return list(ids)


def join_ids(empty: Any, table: list[Any], ids: list[int] | tuple[int, ...], bad: Any) -> Any:
    """``empty.join(table[i] for i in ids)``, with ``bad(ids)`` raised for any id not in ``table``.

    >>> join_ids("", ["a", "b"], [1, 0, 1], ValueError)
    'bab'
    """
    try:
        if ids and min(ids) < 0:  # a negative index would silently wrap around
            raise IndexError
        return empty.join(map(table.__getitem__, ids))
    except (IndexError, TypeError):  # out of range, a gap (None), or not an int
        raise bad(ids) from None


class Tokenizer:
    """Base class of every tokenizer: ``encode``, ``decode``, ``save`` and ``load``.

    >>> from gptlab.tokenizers import CharTokenizer
    >>> tok = CharTokenizer.from_text("hello")
    >>> tok.decode(tok.encode("hole"))
    'hole'
    """

    kind: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            KINDS[cls.kind] = cls

    def __init__(self, special_tokens: Mapping[str, int] | None = None) -> None:
        self.special_tokens: dict[str, int] = dict(special_tokens or {})
        self.chat_template: str | None = (
            None  # a Jinja chat template or a fallback's name (tokenizers/chat.py)
        )
        self._special_regex: dict[frozenset[str], re.Pattern[str]] = {}

    # ----------------------------------------------------------- the algorithm
    # A subclass calls ``_set_decoder`` with {id: token bytes} (special tokens
    # included) and implements the three methods below.
    _table: list[bytes | None]
    _vocab_size: int

    def _set_decoder(self, decoder: Mapping[int, bytes]) -> None:
        """Hold id → token bytes as a list, None for a gap: indexing a list is twice as fast as a dict,
        and one table is held, not two."""
        self._vocab_size = max(decoder, default=-1) + 1
        self._table = [decoder.get(i) for i in range(self._vocab_size)]

    def _decode_also(self, tokens: Sequence[bytes]) -> None:
        """Each id ``i`` that decodes to nothing yet decodes to ``tokens[i]`` (a pretrained vocabulary's
        tokens that no merge reaches, or a duplicate's later id)."""
        table = self._table
        table.extend([None] * (len(tokens) - len(table)))
        for i, token in enumerate(tokens):
            if table[i] is None:
                table[i] = token
        self._vocab_size = len(table)

    def _known(self, id: Any) -> bytes | None:  # noqa: A002 - the interface's name
        """The bytes of ``id`` where it is an id of this vocabulary (an int, numpy's too), else None."""
        if isinstance(id, bool):
            return None
        try:
            i = operator.index(id)
        except TypeError:
            return None
        return self._table[i] if 0 <= i < self._vocab_size else None

    def _encode_ordinary(self, text: str) -> list[int]:
        """Encode checked text, with no special-token handling."""
        raise NotImplementedError

    def _payload(self) -> dict[str, Any]:
        """The kind-specific part of ``to_dict``."""
        raise NotImplementedError

    @classmethod
    def _from_payload(cls, d: Mapping[str, Any], special_tokens: dict[str, int]) -> Tokenizer:
        """The inverse of ``_payload``; ``special_tokens`` is ``d["special_tokens"]``."""
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included: every id is in ``range(vocab_size)``."""
        return self._vocab_size

    # ----------------------------------------------------------------- encode
    @property
    def eot_id(self) -> int | None:
        """The id of ``"<|endoftext|>"``, or ``None`` if this tokenizer has no such token."""
        return self.special_tokens.get(EOT)

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` with every special-token string treated as plain text."""
        return self._encode_ordinary(check_text(text))

    def _allowed(self, allowed_special: AllowedSpecial) -> frozenset[str]:
        if isinstance(allowed_special, str):
            if allowed_special != "all":
                raise GptlabError(
                    f"allowed_special must be 'all' or a set of special tokens, got {allowed_special!r}"
                )
            return frozenset(self.special_tokens)
        allowed = frozenset(allowed_special)
        unknown = allowed - self.special_tokens.keys()
        if unknown:
            raise GptlabError(
                f"allowed_special has {sorted(unknown)!r}, which this tokenizer does not have; "
                f"its special tokens are {sorted(self.special_tokens)!r}"
            )
        return allowed

    def _splitter(self, allowed: frozenset[str]) -> re.Pattern[str]:
        """A regex whose ``split`` isolates the allowed special tokens (longest first)."""
        regex = self._special_regex.get(allowed)
        if regex is None:
            alternatives = "|".join(re.escape(s) for s in sorted(allowed, key=lambda s: (-len(s), s)))
            regex = self._special_regex[allowed] = re.compile(f"({alternatives})")
        return regex

    def encode(self, text: str, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Encode ``text``; special tokens are matched only if in ``allowed_special``.

        ``allowed_special`` is ``"all"`` or a set of special-token strings. A special
        token's text that is not allowed is encoded as ordinary text, never as its id.
        """
        text = check_text(text)
        allowed = self._allowed(allowed_special)
        if not allowed:
            return self._encode_ordinary(text)
        ids: list[int] = []
        for i, part in enumerate(self._splitter(allowed).split(text)):
            if i % 2:
                ids.append(self.special_tokens[part])
            elif part:
                ids.extend(self._encode_ordinary(part))
        return ids

    # ----------------------------------------------------------------- decode
    def token_bytes(self, id: int) -> bytes:  # noqa: A002 - the interface's name
        """The UTF-8 bytes of one token: ``tok.token_bytes(tok.encode("a")[0]) == b"a"``."""
        token = self._known(id)
        if token is None:
            raise self._bad_id([id])
        return token

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenate the bytes of ``ids``: raw output that may end inside a UTF-8 character.

        Generation streams text by feeding these bytes to an incremental UTF-8 decoder.
        """
        return join_ids(b"", self._table, as_id_list(ids), self._bad_id)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def _bad_id(self, ids: Iterable[int]) -> GptlabError:
        """The error for the first id in ``ids`` that is not in the vocabulary."""
        position, bad = next(
            ((i, t) for i, t in enumerate(ids) if self._known(t) is None),
            (0, None),
        )
        return GptlabError(
            f"token id {bad!r} at position {position} is not in the vocabulary "
            f"(ids are ints in 0..{self.vocab_size - 1})"
        )

    # ---------------------------------------------------------- save and load
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict that ``from_dict`` turns back into this tokenizer."""
        template = {"chat_template": self.chat_template} if self.chat_template is not None else {}
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "kind": self.kind,
            "special_tokens": dict(self.special_tokens),
            **template,
            **self._payload(),
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as JSON, atomically (a reader sees the old or the new file)."""
        atomic_write_json(path, self.to_dict())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, special_tokens={self.special_tokens!r})"


def from_dict(d: Mapping[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from ``to_dict()``; dispatches on ``d["kind"]``.

    >>> from gptlab.tokenizers import CharTokenizer
    >>> from_dict(CharTokenizer.from_text("abc").to_dict()).encode("cab")
    [2, 0, 1]
    """
    if not isinstance(d, Mapping):
        raise GptlabError(f"a tokenizer must be a JSON object, got {type(d).__name__}")
    if d.get("format", FORMAT) != FORMAT:
        raise GptlabError(f"this is not a gptlab tokenizer (format {d.get('format')!r}, expected {FORMAT!r})")
    version = d.get("version")
    if version != FORMAT_VERSION:
        raise GptlabError(
            f"tokenizer format version {version!r} is not supported (this gptlab reads version {FORMAT_VERSION})"
        )
    kind = d.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise GptlabError(f"unknown tokenizer kind {kind!r}; expected one of {sorted(KINDS)}")
    specials = d.get("special_tokens", {})
    template = d.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise GptlabError(f"'chat_template' must be a string, got {type(template).__name__}")
    try:
        tok = cls._from_payload(d, dict(specials))
        tok.chat_template = template
        return tok
    except GptlabError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise GptlabError(f"the {kind} tokenizer data is malformed ({type(exc).__name__}: {exc})") from None
