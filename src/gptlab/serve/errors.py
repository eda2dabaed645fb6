"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with a status.

400 bad input, 401 bad key, 404 unknown model or route, 405 wrong method, 413 body too
large, 500 a bug. ``install(app)`` makes every exception of the app answer that way.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gptlab.errors import GptlabError
from gptlab.serve.schemas import MAX_PROMPTS

log = logging.getLogger("gptlab.serve")


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:  # noqa: A002
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status)


class APIError(Exception):
    """An error answered as OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def generation_error(message: str, status: int) -> APIError:
    """A choice that ended with an error event of the scheduler (400 bad input, 500 a bug)."""
    return APIError(status, message, type="invalid_request_error" if status < 500 else "server_error")


def not_found_model(name: str, served: str) -> APIError:
    return APIError(
        404,
        f"the model {name!r} does not exist; this server serves {served!r}",
        param="model",
        code="model_not_found",
    )


# What a field with several accepted types must be (pydantic reports each alternative separately).
UNION_FIELDS = {
    "prompt": (
        f"a string, a list of 1 to {MAX_PROMPTS} strings, a list of token ids, "
        f"or a list of 1 to {MAX_PROMPTS} lists of token ids"
    ),
    "stop": "a string, a list of strings, or null",
    "content": "a string, a list of content parts, or null",
    "tool_choice": '"none", "auto", "required", {"type": "function", "function": {"name": ...}}, or null',
}


def body_error(errors: Sequence[Any]) -> APIError | None:
    """A 400 ``invalid_json`` when the body as a whole is not a JSON object (malformed, missing, a list)."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON in the request body: {first.get('msg')}", code="invalid_json")
    if tuple(first.get("loc", ())) == ("body",):
        got = first.get("input")
        if isinstance(got, bytes):  # FastAPI reads JSON only under a JSON Content-Type
            return APIError(
                400,
                "the request body must be JSON: send 'Content-Type: application/json'",
                code="invalid_json",
            )
        kind = "nothing" if got is None else type(got).__name__
        return APIError(400, f"the request body must be a JSON object, got {kind}", code="invalid_json")
    return None


def validation_error(errors: Sequence[Any]) -> APIError:
    """The first validation problem as a 400, naming the field (``messages.0.role``) and the value."""
    first = errors[0] if errors else {}
    loc = _where(first)
    got = first.get("input")
    message = first.get("msg", "invalid request")
    shown = True  # the value is quoted after the message
    # a union's alternatives add a type tag to the location (``prompt.str``): name the field instead
    for i, part in enumerate(loc):
        if part in UNION_FIELDS and i + 1 < len(loc) and isinstance(loc[i + 1], str):
            head = loc[: i + 1]
            # a list or an object that only one alternative could be (content parts, a named tool
            # choice; the others refused its kind, not its size): the problem inside it, where it is
            # (``messages.0.content.1.type``)
            ours = [e for e in errors if _where(e)[: i + 1] == head]
            inside = [e for e in ours if len(_where(e)) > i + 2]
            kind_only = all(_KIND.match(e.get("type", "")) for e in ours if len(_where(e)) == i + 2)
            if isinstance(got, list | dict) and kind_only and len({_where(e)[i + 1] for e in inside}) == 1:
                first = inside[0]
                loc, message, got = (
                    head + _where(first)[i + 2 :],
                    first.get("msg", message),
                    first.get("input"),
                )
            else:
                loc, message, shown = head, f"must be {UNION_FIELDS[part]}", not isinstance(got, list | dict)
            errors = [first, *(e for e in errors if _where(e)[: i + 1] != head)]  # one problem per field
            break
    param = ".".join(str(x) for x in loc) or None
    detail = f"{param}: {message}" if param else message
    if param and shown and not isinstance(got, dict | list):
        detail += f" (got {json.dumps(got) if _jsonable(got) else repr(got)})"
    more = len(errors) - 1 if errors and errors[0] is first else len(errors)
    if more > 0:
        detail += f"; and {more} more problem(s)"
    return APIError(400, detail, param=param, code=first.get("type"))


#: pydantic's error types for a value of the wrong kind (not the wrong size or content)
_KIND = re.compile(r"^(\w+_type|literal_error|model_attributes_type)$")


def _where(error: Any) -> list[Any]:
    """A validation error's location in the body (``["messages", 0, "role"]``)."""
    return [x for x in error.get("loc", ()) if x != "body"]


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


#: why a body could not be read as JSON, by the exception FastAPI's 400 was raised from
PARSE_ERRORS = {
    RecursionError: "the request body is nested too deeply to be a request",
    UnicodeDecodeError: "the request body is not JSON text (UTF-8)",
}


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(GptlabError)
    async def _gptlab_error(request: Request, exc: GptlabError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "invalid_json", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        detail = PARSE_ERRORS.get(type(exc.__cause__), exc.detail)  # FastAPI's "error parsing the body"
        message = f"{request.method} {request.url.path}: {detail}"
        response = error_response(exc.status_code, message, code=codes.get(exc.status_code))
        response.headers.update(exc.headers or {})  # a 405's Allow
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return (body_error(exc.errors()) or validation_error(exc.errors())).response()

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}", type="server_error")
