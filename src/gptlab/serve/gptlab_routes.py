"""gptlab's own routes and the playground.

GET  /health                 liveness, scheduler load and the prefix cache's counters (``Health``)
GET  /v1/gptlab/limits       every limit a request must respect (the playground reads it)
POST /v1/gptlab/generate     one prompt, SSE per token: text, probability, top alternatives
POST /v1/gptlab/attention    one layer's attention weights (plain path) for a text
GET  /                       the playground (static/index.html, static/app.js)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from gptlab.serve.errors import APIError
from gptlab.serve.fields import grammar_fields
from gptlab.serve.jobs import EndEvent
from gptlab.serve.schemas import AttentionRequest, GenerateRequest
from gptlab.serve.service import Service
from gptlab.serve.transport import DONE, sse, sse_response, watched

if TYPE_CHECKING:
    from gptlab.model import GPT

STATIC = Path(__file__).parent / "static"


class PrefixCacheStats(BaseModel):
    """The prefix cache's counters (``gptlab.generate.prefix_cache``; all 0 with ``--prefix-cache-mb 0``)."""

    budget_bytes: int = Field(description="the byte budget (--prefix-cache-mb); 0: off")
    bytes: int = Field(description="bytes of keys and values held (never above the budget)")
    blocks: int = Field(description="blocks held, each block_tokens positions of every layer")
    block_tokens: int
    hits: int = Field(description="prompts that reused a cached prefix")
    misses: int = Field(description="prompts that found none")
    tokens_looked_up: int = Field(description="prompt tokens of every lookup")
    tokens_reused: int = Field(description="prompt tokens copied from the cache instead of prefilled")
    evictions: int = Field(description="blocks evicted to stay within the budget")


class Health(BaseModel):
    """``GET /health``: liveness, the scheduler's load and the prefix cache."""

    status: str
    model: str
    n_layer: int
    active: int = Field(description="requests decoding now")
    waiting: int = Field(description="requests queued for a slot")
    max_batch: int
    steps: int = Field(description="batched decode steps run")
    tokens: int = Field(description="tokens generated")
    prefix_cache: PrefixCacheStats
    kv_capacity: int = Field(
        description="positions per slot the batch's KV cache holds now: it grows with the requests and "
        "shrinks back after --kv-keep-s idle seconds"
    )
    decode_plan: str = Field(
        description="how the batch decodes now (the plan the server printed at its start; a one-row step "
        "a background compile kept since is taken up as requests arrive)"
    )


def router(service: Service) -> APIRouter:
    r = APIRouter()

    @r.get("/health", response_model=Health)
    async def health() -> dict[str, Any]:
        return service.health()

    @r.get("/v1/gptlab/limits")
    async def limits() -> dict[str, Any]:
        return service.limits()

    @r.post("/v1/gptlab/generate")
    async def generate(request: Request, body: GenerateRequest) -> Response:
        """One prompt, streamed token by token with its probability and the top alternatives."""
        req = service.check_model(body)
        gen = service.generate(req)
        prompt = {
            "type": "prompt",
            "tokens": service.token_texts(gen.jobs[0].prompt_ids),
            "warnings": gen.warnings,
        }

        async def lines() -> AsyncIterator[str]:
            yield sse(prompt)
            try:
                async for event in watched(request, gen):
                    if isinstance(event, EndEvent):
                        yield sse(
                            {
                                "type": "done",
                                "index": event.index,
                                "finish_reason": event.finish_reason,
                                "warnings": event.warnings,
                                "usage": gen.usage([event]),
                            }
                        )
                    elif not event.stop:  # a stop token is never shown
                        yield sse(
                            {
                                "type": "token",
                                "index": event.index,
                                "text": event.text,
                                "id": event.token_id,
                                "prob": event.prob,
                                "top": [{"text": a.text, "prob": a.prob} for a in event.top],
                                **grammar_fields(event),
                            }
                        )
            except APIError as exc:
                yield sse({"type": "error", "message": exc.message})
            yield DONE

        return sse_response(lines())

    @r.post("/v1/gptlab/attention")
    async def attention(body: AttentionRequest) -> dict[str, Any]:
        """The last (or chosen) layer's attention weights ``(H, T, T)`` for ``text`` (plain path)."""
        req = service.check_model(body)
        n_layer = service.model.config.n_layer
        if not -n_layer <= req.layer < n_layer:
            raise APIError(
                400,
                f"layer={req.layer} does not exist; the model has {n_layer} layers "
                f"(0..{n_layer - 1}, or -1 for the last)",
                param="layer",
            )
        ids = service.encode(req.text, "text")[-min(req.max_tokens, service.context) :]
        future = service.scheduler.call(lambda: attention_weights(service.model, ids, req.layer))
        weights = await asyncio.wrap_future(future)  # (H, T, T)
        return {
            "object": "gptlab.attention",
            "model": service.model_name,
            "layer": req.layer % n_layer,
            "n_head": len(weights),
            "tokens": service.token_texts(ids),
            "attentions": weights,
        }

    @r.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    return r


def attention_weights(model: GPT, ids: list[int], layer: int) -> list[list[list[float]]]:
    """``softmax(QKᵀ/√d_k + M)`` of one layer for ``ids``: ``(H, T, T)`` rounded to 4 decimals."""
    import torch

    idx = torch.tensor([ids], dtype=torch.long, device=model.device)
    attentions = model.run(idx, output_attentions=True).attentions
    assert attentions is not None  # asked for
    weights = attentions[layer][0].double().cpu()  # (H, T, T)
    return (weights * 1e4).round().div(1e4).tolist()


def mount_static(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
