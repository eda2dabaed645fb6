"""The HTTP API: OpenAI's completions wire format over the batching scheduler, plus the playground.

Endpoints:

    POST /v1/completions          OpenAI completions (prompt: str | [str] | [int] | [[int]]), SSE with stream
    POST /v1/chat/completions     OpenAI chat completions through a plain role-tagged template
    GET  /v1/models               the one model served (also GET /v1/models/{id})
    GET  /health                  liveness and scheduler load
    POST /v1/gptlab/generate      one prompt, SSE per token: text, probability, top alternatives
    POST /v1/gptlab/attention     one layer's attention weights (plain path) for a text
    GET  /                        the web playground (static/index.html)

Every error is OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``
with the matching status (400 bad input, 401 bad key, 404 unknown model or route,
413 body too large, 500 a bug). Generation never runs on the event loop: the
``Scheduler`` thread owns the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gptlab.errors import GptlabError
from gptlab.serve.scheduler import Channel, EndEvent, Job, Scheduler, TokenEvent, token_text
from gptlab.serve.schemas import (
    AttentionRequest,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    GenerateRequest,
    SamplingFields,
)

log = logging.getLogger("gptlab.serve")
STATIC = Path(__file__).parent / "static"
M = TypeVar("M", bound=BaseModel)

# The plain chat template: role-tagged lines, then the assistant's turn left open.
CHAT_ROLE_PREFIX = "{role}: "
CHAT_OPEN_TURN = "assistant:"
# A base model continues the dialogue by itself; these end the assistant's turn.
CHAT_STOP = ["\nuser:", "\nsystem:", "\nassistant:"]
MAX_CHOICES = 64  # prompts × n per request


class GenerationError(Exception):
    """A choice ended with an error event from the scheduler."""

    def __init__(self, event: EndEvent) -> None:
        super().__init__(event.error)
        self.event = event

    def api_error(self) -> APIError:
        kind = "invalid_request_error" if self.event.status < 500 else "server_error"
        return APIError(self.event.status, str(self.event.error), type=kind)

    def payload(self) -> dict[str, Any]:
        e = self.api_error()
        return {"error": {"message": e.message, "type": e.type, "param": None, "code": None}}


class APIError(Exception):
    """An error answered as OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:  # noqa: A002 - OpenAI's field name
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.code, self.type)


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    type: str = "invalid_request_error",
) -> JSONResponse:  # noqa: A002
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    """The plain chat template: ``"system: …\\nuser: …\\nassistant:"``.

    >>> chat_prompt([ChatMessage(role="user", content="hi")])
    'user: hi\\nassistant:'
    """
    lines = [CHAT_ROLE_PREFIX.format(role=m.role) + m.text() for m in messages]
    return "\n".join([*lines, CHAT_OPEN_TURN])


class LeadingSpace:
    """Drops the whitespace a reply starts with (the template ends at ``assistant:``)."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, text: str) -> str:
        if self.started:
            return text
        text = text.lstrip()
        self.started = bool(text)
        return text


# ------------------------------------------------------------------ the app
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

    ``max_tokens_cap`` (default: the context length) bounds ``max_tokens``; ``api_key``
    (if set) is required as ``Authorization: Bearer KEY`` on every ``/v1`` route;
    a body larger than ``max_body_bytes`` is refused with 413.
    """
    if tokenizer is None:
        raise GptlabError(
            "the checkpoint has no tokenizer.json; serving needs a tokenizer to turn text into ids"
        )
    from gptlab.generate.seq2seq import check_generative

    check_generative(model)
    block_size = model.config.block_size
    cap = max_tokens_cap if max_tokens_cap is not None else block_size
    if cap < 1:
        raise GptlabError(f"max_tokens_cap must be at least 1, got {cap}")
    model.eval()
    scheduler = Scheduler(model, tokenizer, max_batch=max_batch)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        scheduler.close()

    app = FastAPI(title="gptlab", version=_version(), lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.scheduler = scheduler
    app.state.model_name = model_name

    # ------------------------------------------------------------ errors
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(GptlabError)
    async def _gptlab_error(request: Request, exc: GptlabError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(exc.status_code, message, code=codes.get(exc.status_code))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc.errors())

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}", type="server_error")

    # ------------------------------------------------------------ auth
    @app.middleware("http")
    async def _auth(request: Request, call_next: Callable[[Request], Any]) -> Response:
        if api_key and request.url.path.startswith("/v1/"):
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

    # ------------------------------------------------------------ helpers
    async def parse(request: Request, cls: type[M]) -> M:
        """Read the body (at most ``max_body_bytes``), parse JSON, validate against ``cls``."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body_bytes:
            raise APIError(
                413,
                f"request body of {length} bytes exceeds the limit of {max_body_bytes} bytes",
                code="request_too_large",
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise APIError(
                    413, f"request body exceeds the limit of {max_body_bytes} bytes", code="request_too_large"
                )
            chunks.append(chunk)
        try:
            data = json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as exc:
            raise APIError(400, f"malformed JSON in the request body: {exc}", code="invalid_json") from None
        if not isinstance(data, dict):
            raise APIError(
                400, f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json"
            )
        try:
            req = cls.model_validate(data)
        except ValidationError as exc:
            raise _validation_error_of(exc.errors()) from None
        if getattr(req, "model", None) not in (None, model_name):
            raise APIError(
                404,
                f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                param="model",
                code="model_not_found",
            )
        return req

    def encode(text: str, param: str) -> list[int]:
        try:
            return tokenizer.encode(text, allowed_special="all")
        except GptlabError as exc:
            raise APIError(400, f"{param}: {exc}", param=param) from None

    def check_ids(ids: list[int], param: str) -> list[int]:
        bad = [i for i in ids if not 0 <= i < tokenizer.vocab_size]
        if bad:
            raise APIError(
                400,
                f"{param}: token id {bad[0]} is outside the vocabulary (0..{tokenizer.vocab_size - 1})",
                param=param,
            )
        return ids

    def fit_context(ids: list[int], label: str, warnings: list[str]) -> list[int]:
        """A prompt longer than the context keeps its last ``block_size`` tokens (with a warning)."""
        if not ids:
            if tokenizer.eot_id is None:
                raise APIError(400, f"{label} is empty; give at least one token of text", param="prompt")
            return [tokenizer.eot_id]  # an empty prompt starts from end-of-text, like GPT-2
        if len(ids) > block_size:
            warnings.append(
                f"{label} has {len(ids)} tokens, more than the context (block_size={block_size}); "
                f"it was cut to its last {block_size} tokens"
            )
            return ids[-block_size:]
        return ids

    def max_tokens_of(req: SamplingFields, default: int) -> int:
        value = req.max_tokens
        if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
            value = req.max_completion_tokens
        value = default if value is None else value
        if value > cap:
            raise APIError(
                400,
                f"max_tokens={value} is more than this server allows ({cap}); ask for at most {cap} tokens",
                param="max_tokens",
            )
        return value

    def sample_config(req: SamplingFields, max_tokens: int, stop: list[str], seed: int | None) -> Any:
        from gptlab.generate import SampleConfig

        stop_tokens = [tokenizer.eot_id] if tokenizer.eot_id is not None else []
        try:
            return SampleConfig(
                max_new_tokens=max_tokens,
                temperature=req.temperature,
                top_k=req.top_k or None,  # OpenAI-style "off" values (0, 1.0, 0.0) mean no truncation
                top_p=req.top_p if req.top_p < 1.0 else None,
                min_p=req.min_p or None,
                repetition_penalty=req.repetition_penalty,
                frequency_penalty=req.frequency_penalty,
                presence_penalty=req.presence_penalty,
                beam_width=req.beam_width,
                length_penalty=req.length_penalty,
                early_stopping=req.early_stopping,
                stop=stop,
                stop_tokens=stop_tokens,
                seed=seed,
            )
        except GptlabError as exc:
            raise APIError(400, str(exc)) from None

    def start_jobs(
        req: SamplingFields, prompts: list[list[int]], max_tokens: int, stop: list[str], top_n: int = 0
    ) -> tuple[Channel, list[Job]]:
        if len(prompts) * req.n > MAX_CHOICES:
            raise APIError(
                400,
                f"{len(prompts)} prompts × n={req.n} is more than {MAX_CHOICES} choices "
                f"per request; split the request",
                param="n",
            )
        configs = [
            sample_config(req, max(max_tokens, 1), stop, None if req.seed is None else req.seed + i)
            for i in range(req.n)
        ]
        channel = Channel(asyncio.get_running_loop())
        jobs = [
            Job(ids, configs[i], channel, index=p * req.n + i, top_n=top_n)
            for p, ids in enumerate(prompts)
            for i in range(req.n)
        ]
        if max_tokens == 0:  # nothing to generate: answer at once
            for job in jobs:
                job.ended = True
                channel.put(EndEvent(job.index, "length", 0))
            return channel, jobs
        for job in jobs:
            scheduler.submit(job)
        return channel, jobs

    async def cancel_on_disconnect(request: Request, jobs: list[Job]) -> None:
        while True:
            await asyncio.sleep(0.1)
            if await request.is_disconnected():
                for job in jobs:
                    job.cancel()
                return

    async def events(
        request: Request, channel: Channel, jobs: list[Job]
    ) -> AsyncIterator[TokenEvent | EndEvent]:
        """The events of ``jobs`` until all have ended; cancels those left if the consumer stops
        or the client leaves.

        A watcher polls for the client's disconnect: Starlette reports a closed stream by an
        error from ``send`` and leaves this generator suspended, so ``finally`` alone would run
        only when the generator is garbage-collected, and generation would go on until then.
        """
        left = len(jobs)
        watcher = asyncio.create_task(cancel_on_disconnect(request, jobs))
        try:
            while left:
                for event in await channel.get():
                    if isinstance(event, EndEvent):
                        left -= 1
                        if event.error is not None:
                            raise GenerationError(event)
                    yield event
        finally:
            watcher.cancel()
            for job in jobs:
                job.cancel()

    async def collect(
        request: Request, channel: Channel, jobs: list[Job]
    ) -> tuple[dict[int, list[str]], dict[int, EndEvent]]:
        """Gather the whole text of every choice (non-streaming), cancelling if the client leaves."""
        texts: dict[int, list[str]] = {job.index: [] for job in jobs}
        ends: dict[int, EndEvent] = {}
        try:
            async for event in events(request, channel, jobs):
                if isinstance(event, TokenEvent):
                    texts[event.index].append(event.text)
                else:
                    ends[event.index] = event
        except GenerationError as exc:
            raise exc.api_error() from None
        return texts, ends

    def sse(payload: Any) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def sse_response(gen: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(
            gen,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    def usage(prompt_tokens: int, ends: Sequence[EndEvent]) -> dict[str, int]:
        completion = sum(e.completion_tokens for e in ends)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }

    def all_warnings(warnings: list[str], ends: Sequence[EndEvent]) -> list[str]:
        out = list(warnings)
        for e in ends:
            out.extend(w for w in e.warnings if w not in out)
        return out

    # ------------------------------------------------------------ routes
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "n_layer": model.config.n_layer, **scheduler.stats()}

    def model_card() -> dict[str, Any]:
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "gptlab",
            "context_length": block_size,
            "vocab_size": tokenizer.vocab_size,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str) -> dict[str, Any]:
        if model_id != model_name:
            raise APIError(
                404,
                f"the model {model_id!r} does not exist; this server serves {model_name!r}",
                param="model",
                code="model_not_found",
            )
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await parse(request, CompletionRequest)
        warnings: list[str] = []
        raw = req.prompt
        if isinstance(raw, str):
            items: list[str | list[int]] = [raw]
        elif raw and all(isinstance(x, int) for x in raw):
            items = [list(raw)]  # type: ignore[arg-type]
        else:
            items = list(raw)  # type: ignore[arg-type]
        if not items:
            raise APIError(400, "prompt is an empty list; give a string or a list of strings", param="prompt")
        prompts, texts = [], []
        for p, item in enumerate(items):
            label = "prompt" if len(items) == 1 else f"prompt[{p}]"
            ids = encode(item, "prompt") if isinstance(item, str) else check_ids(item, "prompt")
            ids = fit_context(ids, label, warnings)
            prompts.append(ids)
            texts.append(item if isinstance(item, str) else tokenizer.decode(ids))
        max_tokens = max_tokens_of(req, 16)
        channel, jobs = start_jobs(req, prompts, max_tokens, req.stop_list())
        prompt_tokens = sum(len(ids) for ids in prompts)
        cid, now = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        echo = {job.index: texts[job.index // req.n] if req.echo else "" for job in jobs}

        def chunk(index: int, text: str, finish: str | None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "text_completion",
                "created": now,
                "model": model_name,
                "choices": [{"text": text, "index": index, "logprobs": None, "finish_reason": finish}],
            }

        if req.stream:

            async def gen() -> AsyncIterator[str]:
                ends: list[EndEvent] = []
                first = True
                try:
                    for index, text in echo.items():
                        if text:
                            yield sse(chunk(index, text, None))
                    async for event in events(request, channel, jobs):
                        if isinstance(event, TokenEvent):
                            if not event.text:
                                continue
                            payload = chunk(event.index, event.text, None)
                        else:
                            ends.append(event)
                            payload = chunk(event.index, "", event.finish_reason)
                        if first and warnings:
                            payload["warnings"] = warnings
                        first = False
                        yield sse(payload)
                    if req.include_usage():
                        yield sse(
                            {
                                "id": cid,
                                "object": "text_completion",
                                "created": now,
                                "model": model_name,
                                "choices": [],
                                "usage": usage(prompt_tokens, ends),
                            }
                        )
                except GenerationError as exc:
                    yield sse(exc.payload())
                yield "data: [DONE]\n\n"

            return sse_response(gen())

        pieces, ends = await collect(request, channel, jobs)
        choices = [
            {
                "text": echo[i] + "".join(pieces[i]),
                "index": i,
                "logprobs": None,
                "finish_reason": ends[i].finish_reason,
            }
            for i in sorted(pieces)
        ]
        body: dict[str, Any] = {
            "id": cid,
            "object": "text_completion",
            "created": now,
            "model": model_name,
            "choices": choices,
            "usage": usage(prompt_tokens, list(ends.values())),
        }
        if w := all_warnings(warnings, list(ends.values())):
            body["warnings"] = w
        return JSONResponse(body)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = await parse(request, ChatCompletionRequest)
        warnings: list[str] = []
        ids = fit_context(encode(chat_prompt(req.messages), "messages"), "the chat prompt", warnings)
        max_tokens = max_tokens_of(req, cap)
        channel, jobs = start_jobs(req, [ids], max_tokens, [*req.stop_list(), *CHAT_STOP])
        cid, now = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def chunk(index: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": now,
                "model": model_name,
                "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }

        if req.stream:

            async def gen() -> AsyncIterator[str]:
                strip = {job.index: LeadingSpace() for job in jobs}
                ends: list[EndEvent] = []
                try:
                    for n, job in enumerate(jobs):
                        payload = chunk(job.index, {"role": "assistant", "content": ""}, None)
                        if n == 0 and warnings:
                            payload["warnings"] = warnings
                        yield sse(payload)
                    async for event in events(request, channel, jobs):
                        if isinstance(event, TokenEvent):
                            text = strip[event.index](event.text)
                            if text:
                                yield sse(chunk(event.index, {"content": text}, None))
                        else:
                            ends.append(event)
                            yield sse(chunk(event.index, {}, event.finish_reason))
                    if req.include_usage():
                        yield sse(
                            {
                                "id": cid,
                                "object": "chat.completion.chunk",
                                "created": now,
                                "model": model_name,
                                "choices": [],
                                "usage": usage(len(ids), ends),
                            }
                        )
                except GenerationError as exc:
                    yield sse(exc.payload())
                yield "data: [DONE]\n\n"

            return sse_response(gen())

        pieces, ends = await collect(request, channel, jobs)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": "".join(pieces[i]).lstrip()},
                "logprobs": None,
                "finish_reason": ends[i].finish_reason,
            }
            for i in sorted(pieces)
        ]
        body: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion",
            "created": now,
            "model": model_name,
            "choices": choices,
            "usage": usage(len(ids), list(ends.values())),
        }
        if w := all_warnings(warnings, list(ends.values())):
            body["warnings"] = w
        return JSONResponse(body)

    @app.post("/v1/gptlab/generate")
    async def gptlab_generate(request: Request) -> Response:
        """One prompt, streamed token by token with the model's probability and top alternatives."""
        req = await parse(request, GenerateRequest)
        warnings: list[str] = []
        ids = fit_context(encode(req.prompt, "prompt"), "prompt", warnings)
        max_tokens = max_tokens_of(req, min(cap, 200))
        channel, jobs = start_jobs(req, [ids], max_tokens, req.stop_list(), top_n=req.top_n)

        async def gen() -> AsyncIterator[str]:
            yield sse(
                {"type": "prompt", "tokens": [token_text(tokenizer, i) for i in ids], "warnings": warnings}
            )
            try:
                async for event in events(request, channel, jobs):
                    if isinstance(event, TokenEvent):
                        yield sse(
                            {
                                "type": "token",
                                "index": event.index,
                                "text": event.text,
                                "id": event.token_id,
                                "prob": event.prob,
                                "top": [{"text": t, "prob": p} for t, p in event.top or []],
                            }
                        )
                    else:
                        yield sse(
                            {
                                "type": "done",
                                "index": event.index,
                                "finish_reason": event.finish_reason,
                                "warnings": event.warnings,
                                "usage": usage(len(ids), [event]),
                            }
                        )
            except GenerationError as exc:
                yield sse({"type": "error", "message": str(exc)})
            yield "data: [DONE]\n\n"

        return sse_response(gen())

    @app.post("/v1/gptlab/attention")
    async def gptlab_attention(request: Request) -> dict[str, Any]:
        """The last (or chosen) layer's attention weights ``(H, T, T)`` for ``text`` (plain path)."""
        req = await parse(request, AttentionRequest)
        n_layer = model.config.n_layer
        if not -n_layer <= req.layer < n_layer:
            raise APIError(
                400,
                f"layer={req.layer} does not exist; the model has {n_layer} layers "
                f"(0..{n_layer - 1}, or -1 for the last)",
                param="layer",
            )
        ids = encode(req.text, "text")[-min(req.max_tokens, block_size) :]
        future = scheduler.call(lambda: attention_weights(model, ids, req.layer))
        weights = await asyncio.wrap_future(future)  # (H, T, T)
        return {
            "object": "gptlab.attention",
            "model": model_name,
            "layer": req.layer % n_layer,
            "n_head": len(weights),
            "tokens": [token_text(tokenizer, i) for i in ids],
            "attentions": weights,
        }

    # ------------------------------------------------------------ playground
    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def attention_weights(model: Any, ids: list[int], layer: int) -> list[list[list[float]]]:
    """``softmax(QKᵀ/√d_k + M)`` of one layer for ``ids``: ``(H, T, T)`` rounded to 4 decimals."""
    import torch

    idx = torch.tensor([ids], dtype=torch.long, device=model.device)
    out = model.run(idx, output_attentions=True)
    weights = out.attentions[layer][0].double().cpu()  # (H, T, T)
    return (weights * 1e4).round().div(1e4).tolist()


# What a field with several accepted types must be (pydantic reports each alternative separately).
UNION_FIELDS = {
    "prompt": "a string, a list of strings, a list of token ids, or a list of lists of token ids",
    "stop": "a string, a list of strings, or null",
    "content": "a string, a list of content parts, or null",
}


def _validation_error_of(errors: Sequence[Any]) -> APIError:
    """The first validation problem as a 400, naming the field (``messages.0.role``) and the value."""
    first = errors[0] if errors else {}
    loc = [x for x in first.get("loc", ()) if x != "body"]
    got = first.get("input")
    message = first.get("msg", "invalid request")
    # a union's alternatives add a type tag to the location (``prompt.str``): name the field instead
    for i, part in enumerate(loc):
        if part in UNION_FIELDS and i + 1 < len(loc) and isinstance(loc[i + 1], str):
            loc, message = loc[: i + 1], f"must be {UNION_FIELDS[part]}"
            errors = [e for e in errors if [x for x in e.get("loc", ()) if x != "body"][: i + 1] != loc]
            got = _input_at(first, loc)
            break
    param = ".".join(str(x) for x in loc) or None
    detail = f"{param}: {message}" if param else message
    if param and not isinstance(got, dict | list):
        detail += f" (got {json.dumps(got) if _jsonable(got) else repr(got)})"
    more = len(errors) - 1 if errors and errors[0] is first else len(errors)
    if more > 0:
        detail += f"; and {more} more problem(s)"
    return APIError(400, detail, param=param, code=first.get("type"))


def _input_at(error: Any, loc: Sequence[Any]) -> Any:
    """The offending value of a union field: pydantic reports the value inside each alternative."""
    value = error.get("input")
    return value if not isinstance(value, list | dict) else None


def _validation_response(errors: Sequence[Any]) -> JSONResponse:
    return _validation_error_of(errors).response()


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _version() -> str:
    from gptlab import __version__

    return __version__
