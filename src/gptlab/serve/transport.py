"""HTTP plumbing shared by the routes: a size-limited body, server-sent events, and a
generation that stops when its client leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from gptlab.generate.step import TokenEvent
from gptlab.serve.errors import APIError
from gptlab.serve.generation import Generation
from gptlab.serve.jobs import EndEvent
from gptlab.serve.service import Service

M = TypeVar("M", bound=BaseModel)
DONE = "data: [DONE]\n\n"


async def read_request(request: Request, service: Service, cls: type[M]) -> M:
    """Read the body (at most ``service.max_body_bytes``) and parse it as ``cls``."""
    limit = service.max_body_bytes
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise APIError(
            413,
            f"request body of {length} bytes exceeds the limit of {limit} bytes",
            code="request_too_large",
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    return service.parse(b"".join(chunks), cls)


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
