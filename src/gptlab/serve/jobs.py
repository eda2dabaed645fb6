"""A request's jobs and their events: ``Job`` (one choice), ``Channel`` (the request's queue of
events, scheduler thread → event loop) and ``EndEvent`` (a choice is over).

The jobs of one request share its ``Channel``: ``Job.request`` (the channel's identity) is what
the scheduler's fair admission (``admission.py``) counts slots by.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gptlab.generate.request import RequestState, TokenEvent

if TYPE_CHECKING:
    from gptlab.generate import SampleConfig
    from gptlab.generate.driver import Row


# ------------------------------------------------------------------ events
@dataclass
class EndEvent:
    """A choice is finished: ``finish_reason`` is ``"stop"``, ``"length"`` or ``"error"``.

    Text and tokens travel as ``gptlab.generate.TokenEvent`` (``index``: the choice).
    """

    index: int
    finish_reason: str
    completion_tokens: int
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    status: int = 500  # the HTTP status an error maps to: 400 for bad input, 500 for a bug


class Channel:
    """A bounded queue from the scheduler thread to one request's asyncio coroutine.

    ``put`` never blocks (the scheduler checks ``full`` before producing more); ``get``
    waits on the event loop for the next batch of events.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = 64) -> None:
        self._loop = loop
        self._items: deque[TokenEvent | EndEvent] = deque()
        self._ready = asyncio.Event()
        self.limit = limit

    def __len__(self) -> int:
        """Events put and not yet taken."""
        return len(self._items)

    def full(self) -> bool:
        return len(self._items) >= self.limit

    def put(self, item: TokenEvent | EndEvent) -> None:
        self._items.append(item)  # deque.append is atomic
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def get(self) -> list[TokenEvent | EndEvent]:
        """Every event available now (waits for at least one)."""
        while not self._items:
            self._ready.clear()
            if self._items:
                break
            await self._ready.wait()
        out = []
        while self._items:
            out.append(self._items.popleft())
        return out


class Job:
    """One choice of one request: a prompt, a ``SampleConfig`` and the channel its events go to."""

    _ids = itertools.count()

    def __init__(
        self,
        prompt_ids: list[int],
        config: SampleConfig,
        channel: Channel,
        index: int = 0,
        top_n: int | None = None,
    ) -> None:
        self.id = next(Job._ids)
        self.prompt_ids = list(prompt_ids)
        self.config = config
        self.channel = channel
        self.index = index
        self.top_n = top_n  # None: no probabilities; N: the chosen token's and the N most likely
        self.cancelled = threading.Event()
        self.ended = False
        # decoding state, owned by the scheduler thread
        self.state: RequestState | None = None
        self.row: Row | None = None  # its slot, state and last logits, once admitted (gptlab.generate.driver)
        self.pending = False  # its next token is chosen and waits for the next batched step
        self.warnings: list[str] = []
        self.beam_tokens = 0  # a beam-search job's tokens (it has no RequestState)

    @property
    def generated(self) -> int:
        return self.state.sampled if self.state is not None else self.beam_tokens

    def cancel(self) -> None:
        self.cancelled.set()

    @property
    def request(self) -> int:
        """Which request the job belongs to: the jobs of one request share its channel."""
        return id(self.channel)
