"""Byte-level BPE trained from scratch (GPT-2/GPT-4 style).

Ids 0..255 are the bytes; merge ``i`` (a pair of ids) creates id ``256 + i``;
special tokens take the ids after the last merge. Training is ``training.py``
(most frequent pair first, incremental counts, heap; tie rule: highest count,
then smallest left id, then smallest right id). Encoding is ``ranked.py`` (the
blueprint's tokenize(s) = [vocab[τ_i] | τ_i ∈ BPE_segment(s, M)], merging by
rank, with tiktoken as an optional back-end that gives the same ids).

    >>> tok = BPETokenizer.train("low lower lowest " * 20, vocab_size=260, special_tokens=())
    >>> [tok.token_bytes(256 + i) for i in range(4)]
    [b'lo', b'low', b' low', b' lowe']
    >>> tok.decode(tok.encode("lowest"))
    'lowest'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gptlab.errors import GptlabError
from gptlab.tokenizers.base import EOT
from gptlab.tokenizers.patterns import PATTERNS
from gptlab.tokenizers.ranked import RankedTokenizer
from gptlab.tokenizers.training import check_vocab_size, count_chunks, train_merges


def vocab_from_merges(merges: Sequence[Sequence[int]]) -> list[bytes]:
    """``[(97, 98)] -> [b"\\x00", ..., b"\\xff", b"ab"]``; a bad merge is a ``GptlabError``."""
    vocab = [bytes([i]) for i in range(256)]
    for i, merge in enumerate(merges):
        if len(merge) != 2:
            raise GptlabError(f"merge {i} is {merge!r}; a merge is a pair of ids")
        a, b = merge
        for t in (a, b):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < len(vocab):
                raise GptlabError(f"merge {i} refers to id {t!r}, which does not exist before it")
        vocab.append(vocab[a] + vocab[b])
    return vocab


class BPETokenizer(RankedTokenizer):
    """Byte-level BPE with learned ``merges`` and a split ``pattern`` (name or regex)."""

    kind = "bpe"

    def __init__(
        self,
        merges: Sequence[Sequence[int]],
        pattern: str = "gpt4",
        special_tokens: Mapping[str, int] | None = None,
        backend: str = "auto",
    ) -> None:
        vocab = vocab_from_merges(merges)
        self.merges = [(a, b) for a, b in merges]
        ranks = {token: i for i, token in enumerate(vocab)}
        if len(ranks) != len(vocab):
            raise GptlabError("two merges produce the same bytes; every token must be distinct")
        specials = dict(special_tokens or {})
        for s, i in specials.items():
            if isinstance(i, int) and not isinstance(i, bool) and i < len(vocab):
                raise GptlabError(
                    f"special token {s!r} has id {i}, which a merge already uses; use ids >= {len(vocab)}"
                )
        super().__init__(ranks, pattern, specials, backend=backend)

    @classmethod
    def train(
        cls,
        text_or_iterable: str | Iterable[str],
        vocab_size: int,
        pattern: str = "gpt4",
        special_tokens: Sequence[str] = (EOT,),
        progress: bool = False,
        backend: str = "auto",
    ) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from text or an iterable of documents.

        ``pattern`` is ``"gpt2"``, ``"gpt4"`` or a regex. Special-token strings in
        the corpus are cut out before counting. If the corpus runs out of pairs
        first, the vocabulary is smaller than asked. ``progress`` shows bars
        with characters split per second, then merges per second.
        """
        if isinstance(special_tokens, str):
            special_tokens = [special_tokens]
        special_tokens = list(dict.fromkeys(special_tokens))
        num_merges = check_vocab_size(vocab_size, len(special_tokens))
        if pattern not in PATTERNS and not isinstance(pattern, str):
            raise GptlabError(f"pattern must be one of {sorted(PATTERNS)} or a regex string, got {pattern!r}")
        counts = count_chunks(text_or_iterable, pattern, special_tokens, progress=progress)
        if not counts:
            raise GptlabError(
                "the training corpus is empty (no text outside special tokens); give it some text"
            )
        merges, _ = train_merges(counts, num_merges, progress=progress)
        first = 256 + len(merges)
        specials = {s: first + i for i, s in enumerate(special_tokens)}
        return cls(merges, pattern=pattern, special_tokens=specials, backend=backend)

    def _payload(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "merges": [list(m) for m in self.merges]}

    @classmethod
    def _from_payload(cls, d: Mapping[str, Any], special_tokens: dict[str, int]) -> BPETokenizer:
        merges = d["merges"]
        if not isinstance(merges, list) or not all(isinstance(m, list) for m in merges):
            raise GptlabError("'merges' must be a list of [left id, right id] pairs")
        return cls(merges, pattern=d["pattern"], special_tokens=special_tokens)
