"""``Generation``: the jobs of one request, and the events, usage and warnings they produce."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from gptlab.generate.request import TokenEvent
from gptlab.serve.errors import generation_error
from gptlab.serve.jobs import Channel, EndEvent, Job


@dataclass
class Generation:
    """The jobs of one request: ``events()`` yields their events until every job has ended."""

    channel: Channel
    jobs: list[Job]
    prompt_tokens: int
    warnings: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # each prompt's text (for echo)
    tool_names: set[str] | None = None  # a chat with tools: the functions whose calls are read back

    async def events(self) -> AsyncIterator[TokenEvent | EndEvent]:
        """Every event; an error event raises ``APIError``; leaving early cancels what is left."""
        left = len(self.jobs)
        try:
            while left:
                for event in await self.channel.get():
                    if isinstance(event, EndEvent):
                        left -= 1
                        if event.error is not None:
                            raise generation_error(event.error, event.status)
                    yield event
        finally:
            self.cancel()

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()

    def all_warnings(self, ends: Sequence[EndEvent]) -> list[str]:
        out = list(self.warnings)
        for e in ends:
            out.extend(w for w in e.warnings if w not in out)
        return out

    def usage(self, ends: Sequence[EndEvent]) -> dict[str, int]:
        completion = sum(e.completion_tokens for e in ends)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
