"""``POST /v1/gptlab/fill``: a masked-language encoder's predictions at every ``[MASK]`` of a text.

    P(x_i | x̃) = softmax(h_out⁽ⁱ⁾·W_eᵀ)      at every position i where x̃_i = [MASK]

(``gptlab.inspect.fill``, as ``gptlab fill`` prints it; ``[MASK]`` itself is never an answer).
Served only for a model whose task is ``fill-mask`` (``tasks.py``): the route is in that server's
schema and no other's. A text longer than the context keeps its last tokens; a text without
``[MASK]`` has nothing to fill, and is answered with no predictions.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Field

from gptlab.errors import GptlabError
from gptlab.generate.request import token_text
from gptlab.inspect.fill import fill_ids
from gptlab.serve.errors import APIError
from gptlab.serve.schemas import MAX_TEXT_CHARS, WHOLE, Strict
from gptlab.serve.service import Service

MAX_FILL_TOP = 50


class FillRequest(Strict):
    """``POST /v1/gptlab/fill``: the top predictions at each ``[MASK]`` of ``text``."""

    model: str | None = None
    text: str = Field(
        min_length=1, max_length=MAX_TEXT_CHARS, description="a text with [MASK] where a token is missing"
    )
    top: Annotated[int, Field(ge=1, le=MAX_FILL_TOP), WHOLE] = Field(
        default=5, description="predictions per [MASK]"
    )


def router(service: Service) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/gptlab/fill")
    async def fill(body: FillRequest) -> dict[str, Any]:
        """The ``top`` most probable tokens at each ``[MASK]``, and the text with each mask's best guess."""
        req = service.check_model(body)
        ids = service.encode(req.text, "text")
        kept = ids[-service.context :]
        try:
            future = service.scheduler.call(lambda: fill_ids(service.model, service.tokenizer, kept, req.top))
            predictions, filled = await asyncio.wrap_future(future)
        except GptlabError as exc:
            raise APIError(400, f"text: {exc}", param="text") from None
        return {
            "object": "gptlab.fill",
            "model": service.model_name,
            "dropped_tokens": len(ids) - len(kept),
            "tokens": service.token_texts(kept),
            "masks": [
                {"position": p.position, "top": [{"token": t, "prob": q} for t, q in p.top]}
                for p in predictions
            ],
            "filled_tokens": [token_text(service.tokenizer, i) for i in filled],
            "text": service.tokenizer.decode(filled),
        }

    return r


__all__ = ["FillRequest", "router"]
