"""What every session shares: the ``Session`` protocol, its size checks and the window past the context.

A session holds ``max_batch`` rows of a KV cache, each row at most ``max_len`` tokens. When a row is
full its next step slides a window over the text:

    relative or no positions (RoPE, ALiBi, none): the row is rebuilt from its last
        ``keep = ¾·max_len`` tokens, then decoding goes on with the cache;
    absolute positions (learned, sinusoidal): a token's keys depend on its position,
        so every step re-runs the last ``keep = max_len − 1`` tokens.

``Window`` holds that rule, the one sentence that tells the user, and the prompt checks; the dynamic
``BatchSession``, the static ``StaticSession`` and the server's ``Lanes`` each hold one.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from gptlab.errors import GptlabError
from gptlab.generate.decoder import Decoder


class ContextWarning(UserWarning):
    """A prompt was cut to fit the context, or generation went past it (the window slides) or stopped at it."""


class Session(Protocol):
    """Rows of a KV cache and the passes that fill them (dynamic, static, or the server's two lanes).

    ``step({slot: token})`` appends each token and returns, per slot, the next-token logits (the
    dynamic cache) or the next token already chosen inside the graph (the static cache).
    """

    max_batch: int
    max_len: int

    @property
    def free_slots(self) -> int: ...

    def full(self, slot: int) -> bool: ...

    def window_notice(self) -> str: ...

    def fit(self, ids: Sequence[int]) -> list[int]: ...

    def remove(self, slot: int) -> None: ...

    def step(self, feed: dict[int, int]) -> Mapping[int, torch.Tensor | int]: ...


class Window:
    """A session's size (checked once) and what happens past its context."""

    def __init__(self, model: Decoder, max_batch: int, max_len: int | None) -> None:
        block = int(model.config.block_size)
        max_len = block if max_len is None else max_len
        if not isinstance(max_batch, int) or max_batch < 1:
            raise GptlabError(f"max_batch must be a positive integer, got {max_batch!r}")
        if not isinstance(max_len, int) or not 1 <= max_len <= block:
            raise GptlabError(
                f"max_len must be between 1 and the model's block_size ({block}), got {max_len!r}"
            )
        self.max_batch, self.max_len = max_batch, max_len
        self.vocab_size = int(model.config.vocab_size)
        self.can_slide = not model.positional.absolute_table  # RoPE, ALiBi, none: slide with the cache
        # tokens kept when a full row slides: ¾ of it with relative positions, all but one with absolute ones
        self.keep = max(1, (max_len * 3) // 4) if self.can_slide else max_len - 1

    def notice(self) -> str:
        """What happens past the context, in one sentence (shown once per request)."""
        how = (
            f"the cache is rebuilt from the last {self.keep} tokens whenever it fills"
            if self.can_slide
            else "learned/sinusoidal positions: each new token re-runs the window without a cache"
        )
        return (
            f"the text passed the context of {self.max_len} tokens; generation goes on over a "
            f"sliding window of the last {self.max_len} tokens ({how})"
        )

    def fit(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as a list, cut to its last ``max_len`` tokens (with a ``ContextWarning``)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise GptlabError("the prompt is empty; give at least one token (e.g. <|endoftext|>)")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise GptlabError(f"token id {bad} is outside the model's vocabulary (0..{self.vocab_size - 1})")
        if len(ids) > self.max_len:
            warnings.warn(
                f"the prompt has {len(ids)} tokens, more than the context of {self.max_len}; "
                f"keeping its last {self.max_len} tokens",
                ContextWarning,
                stacklevel=4,
            )
            ids = ids[-self.max_len :]
        return ids
