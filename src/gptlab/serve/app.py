"""The app: the service, OpenAI's error shape, API-key auth, the routes and the playground.

Endpoints (``openai_routes.py`` and ``gptlab_routes.py``):

    POST /v1/completions          OpenAI completions (prompt: str | [str] | [int] | [[int]]), SSE with stream
    POST /v1/chat/completions     OpenAI chat completions through a plain role-tagged template
    GET  /v1/models               the one model served (also GET /v1/models/{id})
    GET  /v1/gptlab/limits        every limit a request must respect
    POST /v1/gptlab/generate      one prompt, SSE per token: text, probability, top alternatives
    POST /v1/gptlab/attention     one layer's attention weights (plain path) for a text
    POST /v1/gptlab/inside        the Inside view: every stage of one pass (inside_routes.py)
    POST /v1/gptlab/fill          a masked-language encoder's predictions per [MASK] (fill_routes.py)
    GET  /health                  liveness and scheduler load
    GET  /                        the web playground (static/index.html)

Every error is OpenAI's error object (``errors.py``); every request body is a declared model
(``schemas.py``) and ``GET /openapi.json`` describes them with this server's limits, every
status code and the streamed media types (``openapi.py``). The API key, the body limit and the
web pages a browser lets call the API (CORS) are plain ASGI middleware (``middleware.py``), so a
client's disconnect always reaches its route.
Generation never runs on the event loop: the ``Scheduler`` thread owns the model.

A new group of routes is one ``APIRouter`` module and one line in ``ROUTERS`` (every server) or
``TASK_ROUTERS`` (the servers of one task, ``tasks.py``, placed first): a masked-language encoder's
fill route, and its refusals of the generating routes (a 400, and out of its schema).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI

from gptlab.serve import (
    echo,
    errors,
    fill_routes,
    gptlab_routes,
    inside_routes,
    openai_routes,
    openapi,
    tasks,
)
from gptlab.serve.middleware import APIKey, BodyLimit, cross_origin
from gptlab.serve.scheduler import KV_KEEP_S, PREFIX_CACHE_MB
from gptlab.serve.service import Service

if TYPE_CHECKING:
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

#: the route groups, each ``router(service) -> APIRouter``
ROUTERS: list[Callable[[Service], APIRouter]] = [
    openai_routes.router,
    gptlab_routes.router,
    inside_routes.router,
    echo.router,  # /tokenizer_info, /tokenize, /detokenize (lm-eval's tokenizer_backend=remote)
]
#: the route groups of one task only
TASK_ROUTERS: dict[str, list[Callable[[Service], APIRouter]]] = {
    "generate": [],
    "fill-mask": [tasks.refusals, fill_routes.router],
}


def create_app(
    model: GPT,
    tokenizer: Tokenizer,
    *,
    model_name: str = "gptlab",
    max_batch: int = 8,
    max_tokens_cap: int | None = None,
    api_key: str | None = None,
    max_body_bytes: int = 1 << 20,
    prefix_cache_mb: float = PREFIX_CACHE_MB,
    kv_keep_s: float = KV_KEEP_S,
    cors_origins: Sequence[str] | None = None,
) -> FastAPI:
    """A FastAPI app serving ``model`` with ``tokenizer``; the scheduler thread starts now.

    ``max_tokens_cap`` (default: 1024, or the context length if larger; past the context
    the window slides) bounds ``max_tokens``; ``api_key`` (if set) is required as
    ``Authorization: Bearer KEY`` on every ``/v1`` route; a body larger than
    ``max_body_bytes`` is refused with 413. ``prefix_cache_mb`` MiB hold the keys and values of
    recent prompts for the next ones that start alike (0: no prefix cache; docs/guide/serving.md);
    the batch's KV cache, grown by the requests, is kept ``kv_keep_s`` idle seconds before it shrinks.
    ``cors_origins``: the web pages a browser lets call the API (``middleware.cross_origin``: None, those
    served from this machine; ``["*"]`` any; ``[]`` none).
    """
    service = Service(
        model,
        tokenizer,
        model_name=model_name,
        max_batch=max_batch,
        max_tokens_cap=max_tokens_cap,
        max_body_bytes=max_body_bytes,
        prefix_cache_mb=prefix_cache_mb,
        kv_keep_s=kv_keep_s,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPI(
        title="gptlab",
        version=_version(),
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        strict_content_type=False,  # a body without Content-Type is read as JSON (curl -d ... without -H)
    )
    app.state.service = service
    app.state.scheduler = service.scheduler
    app.state.model_name = model_name
    errors.install(app)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    if api_key:
        app.add_middleware(APIKey, api_key=api_key, paths=echo.PATHS)  # nothing is read before the key
    app.add_middleware(cross_origin, origins=cors_origins)  # outermost: a preflight carries no key
    for router in [*TASK_ROUTERS[service.task], *ROUTERS]:  # the first route that matches answers
        app.include_router(router(service))
    gptlab_routes.mount_static(app)
    openapi.document(app, service, api_key=bool(api_key))
    return app


def _version() -> str:
    from gptlab import __version__

    return __version__
