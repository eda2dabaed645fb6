"""OpenAI's routes: ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models``.

Completions and chat share one path (``respond``) for streaming, collecting, usage and
warnings; a ``_Shape`` holds only what differs between them: object names and how a
choice, a streamed piece and its ``logprobs`` look.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gptlab.generate.request import TokenEvent, token_text
from gptlab.serve import echo
from gptlab.serve.errors import APIError, not_found_model
from gptlab.serve.generation import Generation
from gptlab.serve.jobs import EndEvent
from gptlab.serve.logprobs import chat_logprobs, completion_logprobs
from gptlab.serve.schemas import ChatCompletionRequest, CompletionRequest
from gptlab.serve.service import Service
from gptlab.serve.transport import DONE, sse, sse_response, watched
from gptlab.tokenizers.tools import CallStream, parse_calls


class _Shape(ABC):
    """What a choice looks like; the base has what completions and chat share."""

    object = chunk_object = prefix = ""

    def __init__(self, service: Service, gen: Generation, logprobs: bool) -> None:
        self.tokenizer, self.gen, self.logprobs = service.tokenizer, gen, logprobs

    def opening(self) -> list[dict[str, Any]]:
        """Choices streamed before the first token."""
        return []

    @abstractmethod
    def piece(self, event: TokenEvent) -> list[dict[str, Any]]:
        """The streamed choices for one event (none: nothing to send)."""

    @abstractmethod
    def ending(self, end: EndEvent) -> list[dict[str, Any]]:
        """The last streamed choices: what was held back, then the finish reason."""

    @abstractmethod
    def choice(self, index: int, events: Sequence[TokenEvent], end: EndEvent) -> dict[str, Any]:
        """A whole choice (not streamed)."""

    def wants_logprobs(self, event: TokenEvent) -> bool:
        return self.logprobs and event.token_id is not None


class _Completion(_Shape):
    object = chunk_object = "text_completion"
    prefix = "cmpl"

    def __init__(
        self, service: Service, gen: Generation, req: CompletionRequest, scored: dict[int, dict] | None = None
    ) -> None:
        super().__init__(service, gen, req.logprobs is not None)
        self.echo = {job.index: gen.texts[job.index // req.n] if req.echo else "" for job in gen.jobs}
        self.offset = {i: len(text) for i, text in self.echo.items()}  # text_offset of the next token
        # echo with logprobs: the prompt's own tokens first (serve/echo.py), per choice
        self.scored = {job.index: (scored or {}).get(job.index // req.n) for job in gen.jobs}

    def _choice(self, index: int, text: str, logprobs: Any, finish: str | None) -> dict[str, Any]:
        return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}

    def opening(self) -> list[dict[str, Any]]:
        return [
            self._choice(i, text, self.scored[i], None)
            for i, text in self.echo.items()
            if text or self.scored[i] is not None
        ]

    def piece(self, event: TokenEvent) -> list[dict[str, Any]]:
        logprobs = None
        if self.wants_logprobs(event) and event.token_id is not None:  # (it wants one with an id)
            logprobs = completion_logprobs(self.tokenizer, [event], self.offset[event.index])
            self.offset[event.index] += len(token_text(self.tokenizer, event.token_id))
        if not event.text and logprobs is None:
            return []
        return [self._choice(event.index, event.text, logprobs, None)]

    def ending(self, end: EndEvent) -> list[dict[str, Any]]:
        return [self._choice(end.index, "", None, end.finish_reason)]

    def choice(self, index: int, events: Sequence[TokenEvent], end: EndEvent) -> dict[str, Any]:
        echo = self.echo[index]
        logprobs = completion_logprobs(self.tokenizer, events, len(echo)) if self.logprobs else None
        scored = self.scored[index]
        if logprobs is not None and scored is not None:
            logprobs = {key: scored[key] + values for key, values in logprobs.items()}
        return self._choice(index, echo + "".join(e.text for e in events), logprobs, end.finish_reason)


class _Chat(_Shape):
    object, chunk_object, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, service: Service, gen: Generation, req: ChatCompletionRequest) -> None:
        super().__init__(service, gen, req.logprobs)
        self.started = {job.index: False for job in gen.jobs}  # the reply's leading whitespace is dropped
        names = gen.tool_names
        # with tools, each choice's text is split into content and calls as it streams
        self.calls = {job.index: CallStream(names) for job in gen.jobs} if names is not None else None
        self.called = {job.index: 0 for job in gen.jobs}  # calls streamed per choice

    def _choice(self, index: int, delta: dict, logprobs: Any, finish: str | None) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def opening(self) -> list[dict[str, Any]]:
        return [
            self._choice(job.index, {"role": "assistant", "content": ""}, None, None) for job in self.gen.jobs
        ]

    def wants_logprobs(self, event: TokenEvent) -> bool:
        return super().wants_logprobs(event) and not event.stop  # the end-of-turn token is not reported

    def piece(self, event: TokenEvent) -> list[dict[str, Any]]:
        text = event.text if self.started[event.index] else event.text.lstrip()
        self.started[event.index] = self.started[event.index] or bool(text)
        logprobs = chat_logprobs(self.tokenizer, [event]) if self.wants_logprobs(event) else None
        calls: list[dict[str, Any]] = []
        if self.calls is not None:
            split = self.calls[event.index]
            text = split.feed(text)  # text that may start a call is held back
            calls = self.call_pieces(event.index, split.ready())  # each call once it is complete
        if not text and logprobs is None:
            return calls
        return [self._choice(event.index, {"content": text}, logprobs, None), *calls]

    def call_pieces(self, index: int, calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """OpenAI's ``delta.tool_calls`` chunks for newly completed calls: id, type and name first,
        then the arguments in pieces."""
        out = []
        for name, arguments in calls:
            k = self.called[index]
            self.called[index] += 1
            head = {
                "index": k,
                "id": call_id(),
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            out.append(self._choice(index, {"tool_calls": [head]}, None, None))
            for i in range(0, len(arguments), ARGUMENT_PIECE):
                piece = {"index": k, "function": {"arguments": arguments[i : i + ARGUMENT_PIECE]}}
                out.append(self._choice(index, {"tool_calls": [piece]}, None, None))
        return out

    def ending(self, end: EndEvent) -> list[dict[str, Any]]:
        if self.calls is None:
            return [self._choice(end.index, {}, None, end.finish_reason)]
        rest, calls = self.calls[end.index].finish()
        out = [self._choice(end.index, {"content": rest}, None, None)] if rest else []
        out += self.call_pieces(end.index, calls)
        out.append(self._choice(end.index, {}, None, finish_reason(end, self.called[end.index] > 0)))
        return out

    def choice(self, index: int, events: Sequence[TokenEvent], end: EndEvent) -> dict[str, Any]:
        text = "".join(e.text for e in events).lstrip()
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = end.finish_reason
        if self.gen.tool_names is not None:
            content, calls = parse_calls(text, self.gen.tool_names)
            message["content"] = (content or None) if calls else content  # without its calls (or [])
            if calls:
                message["tool_calls"] = [
                    {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
                    for name, arguments in calls
                ]
                finish = finish_reason(end, True)
        return {
            "index": index,
            "message": message,
            "logprobs": chat_logprobs(self.tokenizer, events) if self.logprobs else None,
            "finish_reason": finish,
        }


def finish_reason(end: EndEvent, called: bool) -> str:
    """``"tool_calls"`` for a reply with calls that ended by itself; ``"length"`` stays (its last call
    may have been cut off, and is then left out)."""
    return "tool_calls" if called and end.finish_reason != "length" else end.finish_reason


#: the characters of a call's ``arguments`` per streamed ``delta.tool_calls`` piece
ARGUMENT_PIECE = 16


def call_id() -> str:
    """A tool call's id, ``call_<24 hex digits>`` (the client sends it back with the result)."""
    return f"call_{uuid.uuid4().hex[:24]}"


async def respond(
    request: Request, service: Service, gen: Generation, shape: _Shape, stream: bool, include_usage: bool
) -> Response:
    """The response for ``gen``: SSE chunks then ``[DONE]``, or one JSON body; usage and warnings in both."""
    cid, now = f"{shape.prefix}-{uuid.uuid4().hex[:24]}", int(time.time())

    def envelope(choices: list[dict[str, Any]], obj: str) -> dict[str, Any]:
        return {"id": cid, "object": obj, "created": now, "model": service.model_name, "choices": choices}

    ends: list[EndEvent] = []

    async def choices() -> AsyncIterator[dict[str, Any]]:
        for choice in shape.opening():
            yield choice
        async for event in watched(request, gen):
            if isinstance(event, EndEvent):
                ends.append(event)
                for choice in shape.ending(event):
                    yield choice
            else:
                for piece in shape.piece(event):
                    yield piece

    if stream:

        async def lines() -> AsyncIterator[str]:
            first = True
            try:
                async for choice in choices():
                    payload = envelope([choice], shape.chunk_object)
                    if first and gen.warnings:
                        payload["warnings"] = gen.warnings
                    first = False
                    yield sse(payload)
                if include_usage:
                    yield sse({**envelope([], shape.chunk_object), "usage": gen.usage(ends)})
            except APIError as exc:
                yield sse(exc.body())
            yield DONE

        return sse_response(lines())

    events: dict[int, list[TokenEvent]] = {job.index: [] for job in gen.jobs}
    async for event in watched(request, gen):
        if isinstance(event, EndEvent):
            ends.append(event)
        else:
            events[event.index].append(event)
    by_index = {e.index: e for e in ends}
    body = envelope([shape.choice(i, events[i], by_index[i]) for i in sorted(events)], shape.object)
    body["usage"] = gen.usage(ends)
    if warnings := gen.all_warnings(ends):
        body["warnings"] = warnings
    return JSONResponse(body)


def router(service: Service) -> APIRouter:
    """OpenAI's routes over ``service``."""
    r = APIRouter()

    @r.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [service.model_card()]}

    @r.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str) -> dict[str, Any]:
        if model_id != service.model_name:
            raise not_found_model(model_id, service.model_name)
        return service.model_card()

    @r.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        """OpenAI's completions; ``stream: true`` answers server-sent events."""
        req = service.check_model(body)
        gen = service.completion(req)
        scored = await echo.prompt_scores(service, gen, req)  # echo with logprobs: the prompt's own
        return await respond(
            request, service, gen, _Completion(service, gen, req, scored), req.stream, req.include_usage()
        )

    @r.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        """OpenAI's chat completions; ``stream: true`` answers server-sent events."""
        req = service.check_model(body)
        gen = service.chat(req)
        return await respond(request, service, gen, _Chat(service, gen, req), req.stream, req.include_usage())

    return r
