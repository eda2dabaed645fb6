"""The app: the service, OpenAI's error shape, API-key auth, the routes and the playground.

Endpoints (``openai_routes.py`` and ``gptlab_routes.py``):

    POST /v1/completions          OpenAI completions (prompt: str | [str] | [int] | [[int]]), SSE with stream
    POST /v1/chat/completions     OpenAI chat completions through a plain role-tagged template
    GET  /v1/models               the one model served (also GET /v1/models/{id})
    GET  /v1/gptlab/limits        every limit a request must respect
    POST /v1/gptlab/generate      one prompt, SSE per token: text, probability, top alternatives
    POST /v1/gptlab/attention     one layer's attention weights (plain path) for a text
    GET  /health                  liveness and scheduler load
    GET  /                        the web playground (static/index.html)

Every error is OpenAI's error object (``errors.py``). Generation never runs on the event
loop: the ``Scheduler`` thread owns the model.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from gptlab.serve import echo, errors, gptlab_routes, openai_routes
from gptlab.serve.errors import error_response
from gptlab.serve.service import Service


def create_app(
    model: Any,
    tokenizer: Any,
    *,
    model_name: str = "gptlab",
    max_batch: int = 8,
    max_tokens_cap: int | None = None,
    api_key: str | None = None,
    max_body_bytes: int = 1 << 20,
) -> FastAPI:
    """A FastAPI app serving ``model`` with ``tokenizer``; the scheduler thread starts now.

    ``max_tokens_cap`` (default: 1024, or the context length if larger; past the context
    the window slides) bounds ``max_tokens``; ``api_key`` (if set) is required as
    ``Authorization: Bearer KEY`` on every ``/v1`` route; a body larger than
    ``max_body_bytes`` is refused with 413.
    """
    service = Service(
        model,
        tokenizer,
        model_name=model_name,
        max_batch=max_batch,
        max_tokens_cap=max_tokens_cap,
        max_body_bytes=max_body_bytes,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPI(title="gptlab", version=_version(), lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.service = service
    app.state.scheduler = service.scheduler
    app.state.model_name = model_name
    errors.install(app)
    if api_key:
        app.middleware("http")(_auth(api_key))
    app.include_router(openai_routes.router(service))
    app.include_router(gptlab_routes.router(service))
    app.include_router(echo.router(service))  # /tokenizer_info, /tokenize, /detokenize
    gptlab_routes.mount_static(app)
    return app


def _auth(api_key: str) -> Callable[[Request, Callable[[Request], Any]], Any]:
    """A middleware asking every ``/v1/`` request for ``Authorization: Bearer KEY``."""

    async def check(request: Request, call_next: Callable[[Request], Any]) -> Response:
        if request.url.path.startswith("/v1/") or request.url.path in echo.PATHS:
            header = request.headers.get("authorization", "")
            given = header[7:].strip() if header.lower().startswith("bearer ") else ""
            if not given:
                return error_response(
                    401,
                    "missing API key: send it as the header 'Authorization: Bearer KEY'",
                    code="invalid_api_key",
                )
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return error_response(401, "incorrect API key", code="invalid_api_key")
        return await call_next(request)

    return check


def _version() -> str:
    from gptlab import __version__

    return __version__
