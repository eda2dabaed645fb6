"""Incremental detokenisation: token ids in, safe text pieces out.

Two things are held back until they are known:

* the bytes of an unfinished multi-byte UTF-8 character (an incremental UTF-8
  decoder keeps them; a piece never ends inside a character);
* a tail of text that could be the start of a stop string. When a stop string
  completes, the text before it is emitted and the stream is ``stopped``.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


def held_back(text: str, stop: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string.

    >>> held_back("hello wo", ["world"])
    2
    """
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class TextStream:
    """``push(token_id) -> text now safe to emit``; ``finish() -> the rest``; ``stopped``."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded text not yet emitted (a possible stop-string start)
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        return self._emit(self._decoder.decode(self.tokenizer.token_bytes(token_id)), final=False)

    def finish(self) -> str:
        """Flush the decoder and any held-back text (an incomplete character becomes U+FFFD)."""
        if self.stopped:
            return ""
        return self._emit(self._decoder.decode(b"", final=True), final=True)

    def _emit(self, new: str, final: bool) -> str:
        text = self._pending + new
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._pending = True, ""
            return text[:cut]
        keep = 0 if final else held_back(text, self.stop)
        self._pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]
