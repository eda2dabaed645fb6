"""HTTP plumbing shared by the routes: server-sent events, and a generation that stops when its
client leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from gptlab.generate.request import TokenEvent
from gptlab.serve.generation import Generation
from gptlab.serve.jobs import EndEvent

DONE = "data: [DONE]\n\n"


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def sse_response(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        gen, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def _cancel_on_disconnect(request: Request, gen: Generation) -> None:
    while True:
        await asyncio.sleep(0.1)
        if await request.is_disconnected():
            gen.cancel()
            return


async def watched(request: Request, gen: Generation) -> AsyncIterator[TokenEvent | EndEvent]:
    """``gen.events()``, cancelled as soon as the client leaves.

    A watcher polls for the disconnect: Starlette reports a closed stream by an error from
    ``send`` and leaves this generator suspended, so ``finally`` alone would run only when the
    generator is garbage-collected, and generation would go on until then.
    """
    watcher = asyncio.create_task(_cancel_on_disconnect(request, gen))
    try:
        async for event in gen.events():
            yield event
    finally:
        watcher.cancel()
        gen.cancel()
