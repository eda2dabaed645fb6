"""Byte-level BPE encoding by merge rank, shared by ``BPETokenizer`` and ``GPT2Tokenizer``.

Blueprint stage 1: tokenize(s) = [vocab[τ_i] | τ_i ∈ BPE_segment(s, M)].

``BPE_segment`` here is tiktoken's rule, so both back-ends give the same ids:

1. cut ``s`` into chunks with the split regex (``patterns.py``);
2. write each chunk as its UTF-8 bytes, one part per byte;
3. repeatedly join the adjacent pair of parts whose concatenation has the lowest
   rank in ``ranks`` (the leftmost such pair on a tie) until no adjacent pair
   concatenates to a token; the ranks of the parts are the ids.

A chunk's ids are cached, so repeated words cost one dict lookup. When tiktoken
is installed, a ``tiktoken.Encoding`` built from the same ranks, pattern and
special tokens does the work in Rust (``backend="tiktoken"``); it is built
locally and never touches the network.

    >>> ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"abc": 257}
    >>> bpe_merge(b"abcab", ranks)
    [257, 256]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gptlab.errors import GptlabError
from gptlab.tokenizers.base import AllowedSpecial, Tokenizer, as_id_list, check_special_tokens, check_text
from gptlab.tokenizers.patterns import compile_pattern, resolve

INF = float("inf")
CACHE_SIZE = 200_000  # chunks; the cache is cleared when it grows past this

try:  # an optional back-end: same ids, in Rust
    import tiktoken
except ImportError:  # pragma: no cover - tiktoken is a dependency, but the pure path must not need it
    tiktoken = None  # type: ignore[assignment]  # None marks the back-end as missing


def bpe_merge(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Split ``piece`` into tokens by lowest-rank merges (leftmost on ties) -> their ranks.

    >>> bpe_merge(b"aaa", {b"a": 0, b"aa": 1})
    [1, 0]
    """
    parts = [piece[i : i + 1] for i in range(len(piece))]
    get = ranks.get
    # pair_ranks[i] = rank of parts[i] + parts[i + 1] (INF if not a token)
    pair_ranks = [get(parts[i] + parts[i + 1], INF) for i in range(len(parts) - 1)]
    while pair_ranks:
        best = min(pair_ranks)
        if best == INF:
            break
        i = pair_ranks.index(best)  # the leftmost lowest rank
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i < len(pair_ranks):
            pair_ranks[i] = get(parts[i] + parts[i + 1], INF)
        if i > 0:
            pair_ranks[i - 1] = get(parts[i - 1] + parts[i], INF)
    try:
        return [ranks[p] for p in parts]
    except KeyError as exc:
        raise GptlabError(
            f"the byte {exc.args[0]!r} has no token in this vocabulary, so it cannot be encoded"
        ) from None


def check_ranks(ranks: Mapping[bytes, int]) -> dict[bytes, int]:
    """Validate ``{token bytes: rank}``: non-empty bytes, distinct int ranks >= 0."""
    out: dict[bytes, int] = {}
    seen: set[int] = set()
    for token, rank in ranks.items():
        if not isinstance(token, bytes) or not token:
            raise GptlabError(f"a token must be non-empty bytes, got {token!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise GptlabError(f"token {token!r} has rank {rank!r}; ranks are ints >= 0")
        if rank in seen:
            raise GptlabError(f"two tokens share the rank {rank} (one of them is {token!r})")
        seen.add(rank)
        out[token] = rank
    return out


BACKENDS = ("auto", "python", "tiktoken")


class RankedTokenizer(Tokenizer):
    """Byte-level BPE from ``ranks`` ({token bytes: id}), a split pattern and special tokens.

    ``backend`` is ``"auto"`` (tiktoken if installed and it accepts the pattern,
    else pure Python), ``"python"`` or ``"tiktoken"``; every back-end gives the same ids. ``checked``:
    the caller built ``ranks`` as ``check_ranks`` requires (non-empty bytes, distinct int ranks ≥ 0), and
    a dict is then held as it is, not copied.
    """

    drop_missing_bytes = False  # True: a byte with no token is left out instead of being an error

    def __init__(
        self,
        ranks: Mapping[bytes, int],
        pattern: str,
        special_tokens: Mapping[str, int] | None = None,
        backend: str = "auto",
        checked: bool = False,
    ) -> None:
        ranks = (ranks if isinstance(ranks, dict) else dict(ranks)) if checked else check_ranks(ranks)
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        # bytes with no token are dropped from the text (as Hugging Face's BPE does) where a subclass allows it
        self._drop = bytes(missing) if self.drop_missing_bytes else b""
        if missing and not self.drop_missing_bytes:
            raise GptlabError(
                f"the rank table has no token for byte 0x{missing[0]:02x} ({len(missing)} bytes missing); "
                "byte-level BPE needs all 256 single bytes"
            )
        super().__init__(check_special_tokens(special_tokens or {}, reserved=0))
        ids = set(ranks.values())
        clash = [s for s, i in self.special_tokens.items() if i in ids]
        if clash:
            raise GptlabError(f"special token {clash[0]!r} has the id of an ordinary token")
        if backend not in BACKENDS:
            raise GptlabError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.pattern = pattern
        self._regex = compile_pattern(pattern)
        self._ranks = ranks
        self._cache: dict[str, list[int]] = {}
        decoder = {rank: token for token, rank in ranks.items()}
        decoder.update({i: s.encode("utf-8") for s, i in self.special_tokens.items()})
        self._set_decoder(decoder)
        self._backend = backend
        self._encoding: Any = None  # the tiktoken.Encoding, built on first use

    @property
    def ranks(self) -> dict[bytes, int]:
        """``{token bytes: id}`` of the ordinary (mergeable) tokens."""
        return self._ranks

    # ------------------------------------------------------------- back-ends
    @property
    def backend(self) -> str:
        """The back-end in use: ``"tiktoken"`` or ``"python"``."""
        if self._backend == "auto":
            self._backend = "tiktoken" if self._tiktoken_encoding(strict=False) is not None else "python"
        elif self._backend == "tiktoken":
            self._tiktoken_encoding(strict=True)
        return self._backend

    def _tiktoken_encoding(self, strict: bool) -> Any:
        if self._encoding is not None:
            return self._encoding
        if tiktoken is None:
            if strict:
                raise GptlabError(
                    "backend='tiktoken' needs the tiktoken package; install it or use backend='python'"
                )
            return None
        try:
            self._encoding = tiktoken.Encoding(
                name=f"gptlab-{self.kind}-{id(self)}",
                pat_str=resolve(self.pattern),
                mergeable_ranks=self._ranks,
                special_tokens=self.special_tokens,
            )
        except Exception as exc:  # tiktoken's Rust regex may reject a custom pattern
            if strict:
                raise GptlabError(
                    f"tiktoken cannot use this tokenizer ({exc}); use backend='python'"
                ) from None
            return None
        return self._encoding

    def with_backend(self, backend: str) -> RankedTokenizer:
        """A copy of this tokenizer that uses ``backend`` (``"python"`` or ``"tiktoken"``)."""
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._cache = {}
        clone._special_regex = {}
        clone._encoding = None
        if backend not in BACKENDS:
            raise GptlabError(f"backend must be one of {BACKENDS}, got {backend!r}")
        clone._backend = backend
        clone.backend  # noqa: B018 - fail now if the back-end is unusable
        return clone

    # --------------------------------------------------------------- encoding
    def _encode_ordinary(self, text: str) -> list[int]:
        if self.backend == "tiktoken":
            return self._encoding.encode_ordinary(text)
        return self._encode_python(text)

    def _encode_python(self, text: str) -> list[int]:
        cache, ranks = self._cache, self._ranks
        out: list[int] = []
        for chunk in self._regex.findall(text):
            ids = cache.get(chunk)
            if ids is None:
                piece = chunk.encode("utf-8")
                if self._drop:
                    piece = piece.translate(None, self._drop)
                rank = ranks.get(piece)
                ids = [rank] if rank is not None else bpe_merge(piece, ranks) if piece else []
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                cache[chunk] = ids
            out += ids
        return out

    def encode(self, text: str, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        if self.backend != "tiktoken":
            return super().encode(text, allowed_special)
        text = check_text(text)
        allowed = self._allowed(allowed_special)
        if not allowed:
            return self._encoding.encode_ordinary(text)
        return self._encoding.encode(text, allowed_special=allowed, disallowed_special=())

    encode.__doc__ = Tokenizer.encode.__doc__

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        ids = as_id_list(ids)
        if self.backend != "tiktoken":
            return super().decode_bytes(ids)
        try:
            return self._encoding.decode_bytes(ids if isinstance(ids, list) else list(ids))
        except (KeyError, OverflowError, TypeError, ValueError):
            raise self._bad_id(ids) from None

    decode_bytes.__doc__ = Tokenizer.decode_bytes.__doc__
