"""Prompt-lookup decoding: draft the next tokens from the text so far, verify them in one forward pass.

    draft:   the last n tokens x_{T−n+1..T} occurred before, at x_{j−n+1..j}   (n = 3, then 2)
             → d_1..d_k = x_{j+1..j+k}                                        (the most recent match)
    verify:  one pass over [t, d_1, …, d_k] gives l_0..l_k, where l_i = logits(x_≤T, t, d_1..d_i)
    accept:  y_1 = choose(l_0); while y_i = d_i: y_{i+1} = choose(l_i)        (each y through RequestState)
    rewind:  the cache keeps t, d_1..d_m (the drafts accepted) and drops the rest

Every token is chosen by the request's own ``RequestState`` from logits computed over exactly the
tokens emitted before it, so the output is the plain loop's: the same greedy text, and, sampling,
the same draws in the same order from the same generator (a pass over k tokens computes what k
one-token steps would, up to the rounding of a wider matrix product). What changes is how many
forward passes it takes: an accepted draft of m tokens costs one pass instead of m + 1.

It pays where the answer copies from its input (editing, extraction, summarising, code), and
costs a wider pass where it does not. So a row that keeps rejecting its drafts stops drafting for a
while (``Backoff``): on free text the loop then runs as plain decoding, token by token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: longest and shortest n-gram matched (a single token recurs everywhere in free text: its drafts
#: mostly fail), and the most tokens drafted at once
MAX_NGRAM = 3
MIN_NGRAM = 2
MAX_DRAFT = 8
#: a row whose drafts were all rejected this many times in a row pauses drafting
REJECTIONS_BEFORE_PAUSE = 2
#: tokens a paused row decodes plainly before it drafts again (doubling, up to the last)
PAUSES = (4, 8, 16, 32, 64)


class NgramIndex:
    """Where each n-gram (``min_ngram`` ≤ n ≤ ``max_ngram``) last occurred in a growing token list, with a token after it.

    ``draft(k)`` → up to ``k`` tokens that followed the most recent earlier occurrence of the list's
    last n tokens, longest n first. Appending a token updates the index in O(max_ngram).

    >>> index = NgramIndex([5, 6, 7, 8, 5, 6])
    >>> index.draft(3)
    [7, 8, 5]
    """

    def __init__(
        self, tokens: Sequence[int] = (), max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM
    ) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.last: dict[tuple[int, ...], int] = {}  # n-gram → index just past its latest occurrence
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        # the n-grams ending at the previous token now have a token after them
        end = len(self.tokens)
        for n in range(1, self.max_ngram + 1):
            if end >= n:
                self.last[tuple(self.tokens[end - n : end])] = end
        self.tokens.append(token)

    def draft(self, k: int) -> list[int]:
        if k <= 0:
            return []
        end = len(self.tokens)
        for n in range(min(self.max_ngram, end), self.min_ngram - 1, -1):
            at = self.last.get(tuple(self.tokens[end - n :]))
            if at is not None:
                return self.tokens[at : at + k]
        return []


@dataclass
class Backoff:
    """When a row drafts: always, until ``REJECTIONS_BEFORE_PAUSE`` drafts in a row are wholly
    rejected; then it decodes ``PAUSES[i]`` tokens plainly (i grows with each pause, and is reset by
    a draft that is accepted at least in part)."""

    rejected: int = 0
    pauses: int = 0
    wait: int = 0

    def ready(self) -> bool:
        if self.wait > 0:
            self.wait -= 1
            return False
        return True

    def record(self, accepted: int) -> None:
        if accepted > 0:
            self.rejected, self.pauses = 0, 0
            return
        self.rejected += 1
        if self.rejected >= REJECTIONS_BEFORE_PAUSE:
            self.wait = PAUSES[min(self.pauses, len(PAUSES) - 1)]
            self.pauses, self.rejected = self.pauses + 1, 0


@dataclass
class DraftStats:
    """What prompt lookup did for one row: passes that verified a draft, tokens drafted and accepted."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0


class PromptLookup:
    """One row's drafter: its n-gram index over prompt + generated tokens, its backoff and its stats."""

    def __init__(self, prompt: Sequence[int], max_draft: int = MAX_DRAFT) -> None:
        self.index = NgramIndex(prompt)
        self.max_draft = max_draft
        self.backoff = Backoff()
        self.stats = DraftStats()

    def append(self, token: int) -> None:
        self.index.append(token)

    def propose(self, room: int) -> list[int]:
        """The draft after the tokens so far (at most ``room`` tokens), or [] to decode plainly."""
        if room <= 0 or not self.backoff.ready():
            return []
        return self.index.draft(min(self.max_draft, room))

    def verified(self, drafted: int, accepted: int) -> None:
        self.stats.passes += 1
        self.stats.drafted += drafted
        self.stats.accepted += accepted
        self.backoff.record(accepted)
