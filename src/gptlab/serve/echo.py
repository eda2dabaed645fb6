"""What lm-eval's ``local-completions`` needs of the server: the prompt's own log-probabilities, and the
tokenizer over HTTP (``tokenizer_backend=remote``).

Echo with ``logprobs`` (``POST /v1/completions {"prompt": [[ids]], "echo": true, "logprobs": N,
"max_tokens": 0 or 1}``) reports every prompt token before the completion's:

    token_logprobs = [null, log p(x_2 | x_1), …, log p(x_n | x_<n)]      p = softmax(l): the model's raw
    top_logprobs   = [null, {the N most probable tokens at 2: log p}, …]  distribution, whatever the
                                                                          temperature or penalties

computed by ``gptlab.evaluate.scoring.prompt_logprobs`` in one forward pass over the prompt, on the
scheduler thread (the model's one owner). lm-eval sums ``token_logprobs[len(context):-1]``: the last
entry is the generated token, which is therefore always reported, a stop token included.

The tokenizer routes (vLLM's shapes, which lm-eval's ``RemoteTokenizer`` reads):

    GET  /tokenizer_info   {"eos_token", "bos_token", "pad_token", "chat_template", "model_max_length", …}
    POST /tokenize         {"prompt": text, "add_special_tokens": false} → {"tokens", "count", "max_model_len"}
    POST /detokenize       {"tokens": [ids]} → {"prompt": text}
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import Field

from gptlab.errors import GptlabError
from gptlab.evaluate.scoring import prompt_logprobs
from gptlab.generate.request import token_text
from gptlab.serve.errors import APIError
from gptlab.serve.generation import Generation
from gptlab.serve.schemas import WHOLE, CompletionRequest, Strict
from gptlab.serve.service import Service
from gptlab.tokenizers.pretrained import encode_text

#: Routes outside ``/v1`` that still need the API key when the server has one.
PATHS = ("/tokenizer_info", "/tokenize", "/detokenize")
MAX_DETOKENIZE = 1 << 16  # ids per /detokenize request


def echo_logprobs(service: Service, ids: list[int], top_n: int) -> dict[str, list[Any]]:
    """The completions ``logprobs`` shape for the prompt ``ids`` (the first token: ``null``)."""
    scores = prompt_logprobs(service.model, ids, top_n)
    tok = service.tokenizer
    tokens = [token_text(tok, i) for i in ids]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    top: list[dict[str, float] | None] = [None]
    top += [{token_text(tok, i): lp for i, lp in alternatives} for alternatives in scores.top]
    return {
        "tokens": tokens,
        "token_logprobs": [None, *scores.token_logprobs][: len(ids)],
        "top_logprobs": top[: len(ids)],
        "text_offset": offsets,
    }


async def prompt_scores(service: Service, gen: Generation, req: CompletionRequest) -> dict[int, dict] | None:
    """Per prompt (its index in ``req.prompt``): the echoed prompt's logprobs, or None without echo + logprobs."""
    if not (req.echo and req.logprobs is not None):
        return None
    prompts = {job.index // req.n: job.prompt_ids for job in gen.jobs}
    try:
        out = {}
        for p, ids in prompts.items():
            future = service.scheduler.call(partial(echo_logprobs, service, ids, req.logprobs or 0))
            out[p] = await asyncio.wrap_future(future)
        return out
    except BaseException:
        gen.cancel()  # the choices were already queued: free their slots
        raise


class TokenizeRequest(Strict):
    """``POST /tokenize``: text → ids (``add_special_tokens``: put the model's BOS first, if it has one)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = False


class DetokenizeRequest(Strict):
    """``POST /detokenize``: ids → text."""

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0), WHOLE]] = Field(max_length=MAX_DETOKENIZE)


def tokenizer_info(service: Service) -> dict[str, Any]:
    tok = service.tokenizer
    return {
        "eos_token": getattr(tok, "eos_token", None) or _text(service, tok.eot_id),
        "bos_token": getattr(tok, "bos_token", None),
        "pad_token": None,
        "chat_template": service.chat_template.source if service.chat_template.name == "model" else None,
        "model_max_length": service.context,
        "vocab_size": tok.vocab_size,
        "tokenizer_class": type(tok).__name__,
    }


def _text(service: Service, token_id: int | None) -> str | None:
    return None if token_id is None else token_text(service.tokenizer, token_id)


def router(service: Service) -> APIRouter:
    r = APIRouter()

    @r.get("/tokenizer_info")
    async def info() -> dict[str, Any]:
        return tokenizer_info(service)

    @r.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        req = service.check_model(body)
        try:
            ids = encode_text(service.tokenizer, req.prompt, add_special_tokens=req.add_special_tokens)
        except GptlabError as exc:
            raise APIError(400, f"prompt: {exc}", param="prompt") from None
        return {"tokens": ids, "count": len(ids), "max_model_len": service.context}

    @r.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        req = service.check_model(body)
        vocab = service.tokenizer.vocab_size
        bad = next((i for i in req.tokens if not 0 <= i < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param="tokens")
        return {"prompt": service.tokenizer.decode(req.tokens)}

    return r
