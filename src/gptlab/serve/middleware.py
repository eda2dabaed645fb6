"""Plain ASGI middleware: the API key, the body-size limit, and which web pages may call the API
(``cross_origin``).

All three wrap the app at the ASGI level (Starlette's ``CORSMiddleware`` is such a wrapper too)
rather than through Starlette's ``BaseHTTPMiddleware``,
which runs the route in a task of its own and hides the client's disconnect from it: behind
it, a streaming request whose client hung up kept its jobs in their slots for ever. Here the
route reads the client's own ``receive``, so a disconnect reaches it (``transport.watched``)
whether a key is set or not.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from fastapi import HTTPException

from gptlab.serve.errors import error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOO_LARGE = "request_too_large"


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


#: the pages a browser may let call the server by default: those served from this machine
#: (``http://localhost:3000``, ``http://127.0.0.1:8080``, ``https://[::1]``), as ollama allows
LOOPBACK_ORIGINS = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?$"


def cross_origin(app: ASGIApp, origins: Sequence[str] | None) -> ASGIApp:
    """``app`` answering browsers' cross-origin requests (CORS) from ``origins``: None, the pages of
    this machine (``LOOPBACK_ORIGINS``); ``["*"]`` any page, as llama.cpp's and vLLM's servers allow;
    ``[]`` none (a browser then keeps every answer from the pages of other origins).

    A browser asks first with an ``OPTIONS`` preflight, which carries no API key: it is answered here,
    outside the key's check, and says that any header may be sent (the key, the OpenAI client's own).
    The answers themselves, a 401 included, say which origin may read them. No cookies are involved
    (``allow_credentials`` off): a page sends the key as the header, as any client does.
    """
    from starlette.middleware.cors import CORSMiddleware

    if origins is not None and not origins:
        return app
    anywhere = origins is not None and "*" in origins
    return CORSMiddleware(
        app,  # type: ignore[arg-type]
        allow_origins=["*"] if anywhere else list(origins or ()),
        allow_origin_regex=LOOPBACK_ORIGINS if origins is None else None,
        allow_methods=["GET", "POST"],
        allow_headers=["*"],
        max_age=600,
    )


class APIKey:
    """Every ``/v1/`` request, and one to ``paths``, needs ``Authorization: Bearer KEY`` (else a 401 in
    OpenAI's shape)."""

    def __init__(self, app: ASGIApp, api_key: str, paths: tuple[str, ...] = ()) -> None:
        self.app, self.key, self.paths = app, api_key.encode(), paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope["path"].startswith("/v1/") or scope["path"] in self.paths):
            header = _header(scope, b"authorization")
            given = header[7:].strip() if header.lower().startswith("bearer ") else ""
            if not given:
                message = "missing API key: send it as the header 'Authorization: Bearer KEY'"
                return await error_response(401, message, code="invalid_api_key")(scope, receive, send)
            if not hmac.compare_digest(given.encode(), self.key):
                return await error_response(401, "incorrect API key", code="invalid_api_key")(
                    scope, receive, send
                )
        await self.app(scope, receive, send)


class BodyLimit:
    """A request body over ``limit`` bytes is a 413: at once from ``Content-Length``, else while read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = _header(scope, b"content-length")
        if length.isascii() and length.isdigit() and int(length) > self.limit:
            message = f"request body of {length} bytes exceeds the limit of {self.limit} bytes"
            return await error_response(413, message, code=TOO_LARGE)(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # the route reading the body answers 413 (errors.install)
                    raise HTTPException(413, f"request body exceeds the limit of {self.limit} bytes")
            return message

        await self.app(scope, counted, send)
