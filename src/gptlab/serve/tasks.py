"""What the served model does: generate text, or fill masks (a bidirectional encoder).

A masked-language encoder has no next-token distribution (``P(x_i | x̃)`` sees both sides), so a
server of one answers the generating endpoints (``GENERATING``) with a 400 that says so, before
reading the body (``refusals``, a router placed before the others), and offers the Inside view and
``POST /v1/gptlab/fill`` instead. The task is chosen by the model's architecture (``TASKS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fastapi import APIRouter

from gptlab.inspect.fill import MASK
from gptlab.serve.errors import APIError

if TYPE_CHECKING:
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

#: the served model's task, by ``config.arch``
TASKS = {"decoder": "generate", "encoder-decoder": "generate", "encoder": "fill-mask"}
#: the routes that generate
GENERATING = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/gptlab/generate",
    "/v1/gptlab/inside/grammar",  # a reply written or walked under a grammar: a decoder's
)


class Served(Protocol):
    """What the refusals need of the service: the name it serves under."""

    model_name: str


def task_of(model: GPT) -> str:
    return TASKS[getattr(model.config, "arch", "decoder")]


def mask_token(tokenizer: Tokenizer) -> str | None:
    """``[MASK]`` when the tokenizer has it (a masked-language model's), else None."""
    return MASK if MASK in (getattr(tokenizer, "special_tokens", None) or {}) else None


def cannot_generate(model_name: str) -> APIError:
    """The generating endpoints' answer for a masked-language encoder."""
    return APIError(
        400,
        f"{model_name!r} is a bidirectional encoder (a masked-language model): it fills masks and does "
        "not generate; use POST /v1/gptlab/fill with a text containing [MASK], or the playground's "
        "Inside view",
        param="model",
        code="model_cannot_generate",
    )


def refusals(service: Served) -> APIRouter:
    """``GENERATING`` answered with ``cannot_generate``, whatever the body (out of the schema)."""
    r = APIRouter()

    async def refuse() -> None:
        raise cannot_generate(service.model_name)

    for path in GENERATING:
        r.add_api_route(path, refuse, methods=["POST"], include_in_schema=False)
    return r


__all__ = ["GENERATING", "TASKS", "cannot_generate", "mask_token", "refusals", "task_of"]
