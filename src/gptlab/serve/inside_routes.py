"""The playground's Inside view: one forward pass, stage by stage (``gptlab.inspect.inside``).

POST /v1/gptlab/inside             the pipeline's stages, the logit lens and the logits at one
                                   position (the last, or a masked-language model's first [MASK]),
                                   and one layer's attention
POST /v1/gptlab/inside/attention   one layer's attention (every head) of the same pass
POST /v1/gptlab/inside/grammar     a reply under a JSON schema or a regex, step by step: which tokens
                                   the grammar allowed, their probabilities with and without the
                                   mask, and where the model's own choice was forbidden
                                   (``gptlab.inspect.inside_grammar``); without ``completion`` the
                                   server first writes the reply under the grammar (the scheduler's
                                   own sampler, greedy unless a temperature is given)

The pass runs on the scheduler thread (the one owner of the model) and its result is kept in a
small cache keyed by the token ids, so that picking another layer costs a lookup, not a pass
(another position or ``top`` is another pass).
It is sent compactly:

    attention   w ∈ [0, 1] as q = round(w·65535), uint16 little-endian, base64: |w − q/65535| ≤ 1/131070
    logits      z as float32 little-endian, base64 (the whole vocabulary: the page applies
                temperature, top-k, top-p and min-p itself, as ``gptlab.generate.sampling`` does)

Inputs longer than ``max_inside_tokens`` (``GET /v1/gptlab/limits``) keep their last tokens.
Serve imports inspect: both sit at layer 7, as ``train`` imports ``inspect.flops``.
"""

from __future__ import annotations

import asyncio
import base64
from collections import OrderedDict
from typing import Annotated, Any, Literal

import torch
from fastapi import APIRouter, Depends, Request
from pydantic import ConfigDict, Field, WithJsonSchema

from gptlab.errors import GptlabError
from gptlab.generate import SampleConfig
from gptlab.generate.grammar import Constraint
from gptlab.generate.request import TokenEvent, vocab_size
from gptlab.inspect.inside import MAX_TOP, Inside, inside, resolve_position
from gptlab.inspect.inside_grammar import grammar_steps, reply_stops
from gptlab.serve.errors import APIError, not_found_model
from gptlab.serve.generation import Generation
from gptlab.serve.jobs import Channel, EndEvent, Job
from gptlab.serve.schemas import (
    MAX_INSIDE_TOKENS,
    MAX_TEXT_CHARS,
    SCHEMA_OBJECT,
    SEED_RANGE,
    WHOLE,
    Strict,
    Temperature,
    TokenIds,
    either,
    fields,
)
from gptlab.serve.service import Service

WEIGHT_SCALE = 65535  # attention weights travel as round(w·WEIGHT_SCALE), uint16
CACHE_ENTRIES = 4  # passes kept (each holds L·H·T² float32 weights)

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "a field out of bounds, a layer the model lacks, or text that encodes to no tokens"},
    404: {"description": "the model named is not the one served"},
    413: {"description": "a body larger than the server's max_body_bytes"},
}
GRAMMAR_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    400: {
        "description": "a field out of bounds, a JSON schema or regex the grammar engine cannot compile "
        "(the message names the part), both or neither of them, or a model that is not a decoder"
    },
}


class InsideAttentionRequest(Strict):
    """``POST /v1/gptlab/inside/attention``: one layer's attention weights for ``text``."""

    model: str | None = None
    text: str = Field(
        min_length=1, max_length=MAX_TEXT_CHARS, description="the input (an encoder–decoder's source)"
    )
    max_tokens: Annotated[int, Field(ge=1, le=MAX_INSIDE_TOKENS), WHOLE] = Field(
        default=MAX_INSIDE_TOKENS, description="keep the last this many tokens"
    )
    layer: Annotated[int, Field(ge=-64, le=1024), WHOLE] = Field(
        default=0, description="layer, from 0; negative counts from the last"
    )
    kind: Literal["self", "cross", "encoder"] = Field(
        default="self", description="self-attention; an encoder–decoder also has cross and encoder"
    )


class InsideRequest(InsideAttentionRequest):
    """``POST /v1/gptlab/inside``: every stage of one forward pass, and the attention of ``layer``."""

    top: Annotated[int, Field(ge=1, le=MAX_TOP), WHOLE] = Field(
        default=10, description="tokens per logit-lens layer and bars"
    )
    position: Annotated[int, Field(ge=-MAX_INSIDE_TOKENS, le=MAX_INSIDE_TOKENS - 1), WHOLE] | None = Field(
        default=None,
        description="where the lens and the distribution are read, in the kept tokens; negative counts "
        "from the end, past an end is that end; default: the last, or a masked-language model's first [MASK]",
    )


MAX_REGEX_CHARS = 4096


class InsideGrammarRequest(Strict):
    """``POST /v1/gptlab/inside/grammar``: a reply to ``text`` under a JSON schema or a regex, step by step."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                either(
                    fields(("json_schema",), json_schema={"type": "object"}, regex={"type": "null"}),
                    fields(("regex",), regex={"type": "string"}, json_schema={"type": "null"}),
                )
            ]
        },
    )

    model: str | None = None
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="the prompt the reply follows")
    json_schema: Annotated[dict[str, Any], WithJsonSchema(SCHEMA_OBJECT)] | None = Field(
        default=None,
        description="the reply is JSON valid against this schema (as response_format json_schema)",
    )
    regex: (
        Annotated[str, Field(min_length=1, max_length=MAX_REGEX_CHARS, json_schema_extra={"format": "regex"})]
        | None
    ) = Field(
        default=None, description="the reply matches this regular expression (as gptlab sample --regex)"
    )
    completion: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | TokenIds | None = Field(
        default=None,
        description="the reply to walk through the grammar, as text or token ids; null: the server "
        "writes one under the grammar first",
    )
    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_INSIDE_TOKENS - 1), WHOLE] = Field(
        default=24,
        description="without completion: the reply's length at most (and within max_inside_tokens)",
    )
    temperature: Temperature = Field(default=0.0, description="without completion: 0 = greedy")
    seed: Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1]), WHOLE] | None = None
    top: Annotated[int, Field(ge=1, le=MAX_TOP), WHOLE] = Field(
        default=10, description="allowed tokens and unconstrained tokens listed per step"
    )


def encode_weights(weights: torch.Tensor) -> str:
    """Attention weights in [0, 1] → base64 of ``round(w·65535)`` as little-endian uint16."""
    q = (weights.double() * WEIGHT_SCALE).round().clamp(0, WEIGHT_SCALE).to(torch.int32)
    return base64.b64encode(q.numpy().astype("<u2").tobytes()).decode()


def encode_floats(values: torch.Tensor) -> str:
    """Values → base64 of little-endian float32."""
    return base64.b64encode(values.float().numpy().astype("<f4").tobytes()).decode()


class InsideCache:
    """The last ``CACHE_ENTRIES`` passes, by token ids (used on the event loop only)."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple[int, ...], Inside] = OrderedDict()

    def get(self, ids: tuple[int, ...], top: int | None, position: int | None) -> Inside | None:
        """The pass of ``ids``, if its ``top`` and ``position`` are these (None: any)."""
        found = self.entries.get(ids)
        if found is None or any(
            want not in (None, got) for want, got in ((top, found.top), (position, found.position))
        ):
            return None
        self.entries.move_to_end(ids)
        return found

    def put(self, ids: tuple[int, ...], result: Inside) -> None:
        self.entries[ids] = result
        self.entries.move_to_end(ids)
        while len(self.entries) > CACHE_ENTRIES:
            self.entries.popitem(last=False)


def router(service: Service) -> APIRouter:
    async def body_limit(request: Request) -> None:
        """A declared Content-Length over ``max_body_bytes`` is a 413 before the body is read."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > service.max_body_bytes:
            raise APIError(
                413,
                f"request body of {length} bytes exceeds the limit of {service.max_body_bytes} bytes",
                code="request_too_large",
            )

    r = APIRouter(dependencies=[Depends(body_limit)])
    cache = InsideCache()
    limit = min(MAX_INSIDE_TOKENS, service.context)

    async def computed(req: InsideAttentionRequest, top: int | None) -> tuple[list[int], int, Inside]:
        """The pass for ``req.text`` (cached); ``top`` None (the attention route): any cached pass."""
        if req.model not in (None, service.model_name):
            raise not_found_model(req.model, service.model_name)
        ids = service.encode(req.text, "text")
        if not ids:
            raise APIError(400, "text: encodes to no tokens; give some text", param="text")
        kept = ids[-min(req.max_tokens, limit) :]
        position = None
        if isinstance(req, InsideRequest):
            position = resolve_position(service.model, service.tokenizer, kept, req.position)
        found = cache.get(tuple(kept), top, position)
        if found is None:
            n, at = top or 10, position

            def run() -> Inside:
                return inside(service.model, service.tokenizer, kept, top=n, position=at)

            found = await asyncio.wrap_future(service.scheduler.call(run))
            cache.put(tuple(kept), found)
        return kept, len(ids) - len(kept), found

    def layer_of(result: Inside, req: InsideAttentionRequest) -> dict[str, Any]:
        maps = result.attentions.get(req.kind)
        if maps is None:
            raise APIError(
                400,
                f"kind={req.kind!r}: this model has {', '.join(result.attentions)} attention only",
                param="kind",
            )
        n = maps.size(0)
        if not -n <= req.layer < n:
            raise APIError(
                400,
                f"layer={req.layer} does not exist; the {req.kind} attention has {n} layers "
                f"(0..{n - 1}, or negative from the last)",
                param="layer",
            )
        weights = maps[req.layer]  # (H, T_q, T_k)
        return {
            "kind": req.kind,
            "layer": req.layer % n,
            "n_head": weights.size(0),
            "shape": list(weights.shape),
            "scale": WEIGHT_SCALE,
            "data": encode_weights(weights),
        }

    @r.post("/v1/gptlab/inside", responses=ERRORS)
    async def inside_view(req: InsideRequest) -> dict[str, Any]:
        """Every stage of the blueprint's pipeline for ``text``, the logit lens, and one layer's attention."""
        ids, dropped, result = await computed(req, req.top)
        return {
            "object": "gptlab.inside",
            "model": service.model_name,
            "dropped_tokens": dropped,
            "max_inside_tokens": limit,
            **result.overview,
            "next_logits": {"dtype": "float32", "data": encode_floats(result.next_logits)},
            "attention_layer": layer_of(result, req),
        }

    @r.post("/v1/gptlab/inside/attention", responses=ERRORS)
    async def inside_attention(req: InsideAttentionRequest) -> dict[str, Any]:
        """One layer's attention weights ``(H, T_q, T_k)`` for ``text``, from the cached pass when there is one."""
        ids, dropped, result = await computed(req, None)
        return {"object": "gptlab.inside.attention", "model": service.model_name, **layer_of(result, req)}

    async def written(prompt: list[int], config: SampleConfig) -> tuple[list[int], str]:
        """The reply the server's own sampler writes under ``config`` (one job on the scheduler), with
        its stop token if it drew one → (ids, finish reason; "no_token" where the grammar got stuck)."""
        # top_n 0: the stop token drawn is reported too
        job = Job(prompt, config, Channel(asyncio.get_running_loop()), top_n=0)
        gen = Generation(job.channel, [job], len(prompt))
        service.scheduler.submit(job)
        ids: list[int] = []
        finish = "length"
        try:
            async for event in gen.events():
                if isinstance(event, EndEvent):
                    finish = event.finish_reason
                elif isinstance(event, TokenEvent) and event.token_id is not None:
                    ids.append(event.token_id)
        except APIError as exc:
            if exc.status != 400:  # pragma: no cover - a bug, reported as such
                raise
            finish = "no_token"  # no token of this vocabulary could go on: the steps show where
        return ids, finish

    @r.post("/v1/gptlab/inside/grammar", responses=GRAMMAR_ERRORS)
    async def inside_grammar(req: InsideGrammarRequest) -> dict[str, Any]:
        """A reply to ``text`` under ``json_schema`` or ``regex``: at each step, the tokens the grammar
        allowed, their probabilities with and without the mask, and the model's own choice."""
        if req.model not in (None, service.model_name):
            raise not_found_model(req.model, service.model_name)
        given = [n for n in ("json_schema", "regex") if getattr(req, n) is not None]
        if len(given) != 1:
            raise APIError(
                400,
                f"give exactly one of json_schema and regex, got {', '.join(given) or 'neither'}",
                param=(given or ["json_schema"])[-1],
            )
        what = given[0]
        if service.model.config.arch != "decoder":
            raise APIError(
                400,
                f"the grammar view reads a decoder's replies; this model is an {service.model.config.arch}",
                param="model",
            )
        tok = service.tokenizer
        try:
            config = SampleConfig(json_schema=req.json_schema, regex=req.regex)
            constraint = Constraint(config, tok, vocab_size(service.model, tok), reply_stops(config, tok))
        except GptlabError as exc:
            raise APIError(400, f"{what}: {exc}", param=what) from None
        try:
            constraint.allowed()
            can_start = True
        except GptlabError:  # no token of this vocabulary starts the reply: the one step shows it
            can_start = False
        ids = service.encode(req.text, "text")
        if not ids:
            raise APIError(400, "text: encodes to no tokens; give some text", param="text")
        generated = req.completion is None
        dropped_reply = 0
        if req.completion is None:
            n = min(req.max_new_tokens, limit - 1)
            prompt = ids[-(limit - n) :]
            sampling = SampleConfig(
                max_new_tokens=n,
                temperature=req.temperature,
                seed=req.seed,
                stop_tokens=sorted(reply_stops(config, tok)),
                json_schema=req.json_schema,
                regex=req.regex,
            )
            reply, finish = await written(prompt, sampling) if can_start else ([], "no_token")
        else:
            if isinstance(req.completion, list):  # token ids, as the sampler drew them
                reply = list(req.completion)
                bad = [i for i in reply if i >= service.tokenizer.vocab_size]
                if bad:
                    raise APIError(
                        400,
                        f"completion: token id {bad[0]} is outside the vocabulary "
                        f"(0..{service.tokenizer.vocab_size - 1})",
                        param="completion",
                    )
            else:
                reply = service.encode(req.completion, "completion") if req.completion else []
            dropped_reply = max(0, len(reply) - (limit - 1))
            reply, finish = reply[: limit - 1], "given"
        prompt = ids[-(limit - len(reply)) :]

        def run() -> dict[str, Any]:
            return grammar_steps(service.model, tok, prompt, reply, config, top=req.top)

        try:
            view = await asyncio.wrap_future(service.scheduler.call(run))
        except GptlabError as exc:
            raise APIError(400, str(exc)) from None
        return {
            "object": "gptlab.inside.grammar",
            "model": service.model_name,
            "generated": generated,
            "finish_reason": finish,
            "dropped_tokens": len(ids) - len(prompt),
            "dropped_completion_tokens": dropped_reply,
            "max_inside_tokens": limit,
            **view,
        }

    return r


__all__ = [
    "InsideAttentionRequest",
    "InsideGrammarRequest",
    "InsideRequest",
    "encode_floats",
    "encode_weights",
    "router",
]
