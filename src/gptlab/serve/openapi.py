"""The served OpenAPI schema (``GET /openapi.json``): what a client may send and what it gets back.

FastAPI writes the request bodies from the declared models (``schemas.py``); this module adds
what only the running server knows and what FastAPI does not say by itself:

* the limits of this server: no ``tools`` where its tokenizer cannot write a call, ``max_tokens`` ≤ its cap, token ids and ``logit_bias`` keys below
  its vocabulary, ``layer`` within the model, a non-empty prompt when the tokenizer has no
  end-of-text token to start from, and, for a character tokenizer without an unknown-character
  token, the characters a text may use (``pattern``); for a vocabulary that cannot write JSON,
  ``response_format`` text only;
* every status code a route answers, each error in OpenAI's shape (``ErrorResponse``), and
  FastAPI's unused 422 removed (a bad body is a 400 here);
* the media types of the streamed routes (``text/event-stream``);
* the bearer-key security scheme when the server has a key;
* for a masked-language encoder, no generating routes (``NOT_SERVED``): they only answer a 400.

A route added elsewhere (``app.include_router``) gets the same error responses; ``RESPONSES``
names the status codes per kind of route.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from gptlab.generate.driver import is_seq2seq
from gptlab.serve.service import Service
from gptlab.serve.tasks import GENERATING

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


class ErrorDetail(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error the server answers: ``{"error": {...}}``."""

    error: ErrorDetail


WHY = {
    "400": "Bad request: malformed JSON, a field out of its bounds, or a value this model cannot take",
    "401": "Missing or incorrect API key (only when the server was started with --api-key)",
    "404": "The model named in the request is not the one served",
    "413": "The request body is larger than the server's limit",
    "500": "A bug on the server (this request's own; other requests are unaffected)",
}
#: the error status codes per kind of route: "post" (a request body), "model" (a model id in the path)
RESPONSES = {"post": ("400", "404", "413", "500"), "model": ("404",), "get": ()}
#: routes that stream: with ``stream: true`` (both media types), or always
STREAMED = {
    "/v1/completions": "optional",
    "/v1/chat/completions": "optional",
    "/v1/gptlab/generate": "always",
}
#: the routes left out of the schema, by the server's task (``tasks.py``)
NOT_SERVED = {"generate": (), "fill-mask": GENERATING}
#: one server-sent event (OpenAPI 3.1: the schema of a text/event-stream describes each event)
SSE = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {"type": "string", "description": "a JSON object; the last event is [DONE]"},
                "event": {"type": "string"},
            },
        }
    }
}


def digits_below(n: int) -> str:
    """A regex for the decimal numbers ``0 .. n-1`` (leading zeros allowed, as ``int()`` reads them).

    >>> import re
    >>> [bool(re.fullmatch(digits_below(65), s)) for s in ("0", "64", "007", "65", "99", "1x")]
    [True, True, True, False, False, False]
    """
    top = str(n - 1)
    parts = [r"[0-9]"] if len(top) > 1 else [f"[0-{top}]"]
    parts += [rf"[1-9][0-9]{{{k - 1}}}" for k in range(2, len(top))]
    if len(top) > 1:
        for i, d in enumerate(top):
            low = 1 if i == 0 else 0
            if int(d) > low:
                parts.append(f"{top[:i]}[{low}-{int(d) - 1}]" + (f"[0-9]{{{len(top) - i - 1}}}"))
        parts.append(top)
    return "^0*(?:" + "|".join(parts) + ")$"


def _set(schema: dict[str, Any], field: str, kind: str | None = None, **bounds: Any) -> None:
    """Add ``bounds`` to ``field`` of a component schema (inside ``anyOf`` alternatives too); with
    ``kind``, to its values of that JSON type only (a string, or the strings of a list)."""
    prop = schema.get("properties", {}).get(field)
    if prop is None:
        return
    for alt in prop.get("anyOf", [prop]):
        target = alt.get("items", alt) if kind is not None and alt.get("type") == "array" else alt
        if target.get("type") not in (None, "null") and kind in (None, target.get("type")):
            target.update(bounds)


def _token_ids(prop: dict[str, Any], vocab: int) -> None:
    """Every integer item (at any depth) of ``prop`` below ``vocab``."""
    for alt in prop.get("anyOf", [prop]):
        items = alt.get("items")
        if isinstance(items, dict):
            if items.get("type") == "integer":
                items["maximum"] = vocab - 1
            _token_ids(items, vocab)


def alphabet(tokenizer: Tokenizer) -> str | None:
    """A ``pattern`` for the texts ``tokenizer`` can encode: None when it encodes any text.

    A character tokenizer (``chars``) without an unknown-character token (``unk``) refuses any
    other character; its special tokens (``[MASK]``, ``<|endoftext|>``) are read whole.
    """
    chars = getattr(tokenizer, "chars", None)
    if chars is None or getattr(tokenizer, "unk", None) is not None:
        return None
    one = "[" + "".join("\\" + c if c in "\\]^-[" else c for c in chars) + "]"
    specials = [
        "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in t) for t in tokenizer.special_tokens
    ]
    return f"^(?:{'|'.join([one, *specials])})*$" if specials else f"^{one}*$"


def _texts(components: dict[str, Any], pattern: str) -> None:
    """``pattern`` on every text that is encoded: prompts, message contents, attention texts."""
    fields = {
        "CompletionRequest": ["prompt"],
        "GenerateRequest": ["prompt"],
        "ChatMessage": ["content"],
        "ContentPart": ["text"],
        "AttentionRequest": ["text"],
        "InsideAttentionRequest": ["text"],
        "InsideRequest": ["text"],
        "InsideGrammarRequest": ["text", "completion"],
        "FillRequest": ["text"],
        "TokenizeRequest": ["prompt"],
    }
    for name, names in fields.items():
        for field in names:
            _set(components.get(name, {}), field, "string", pattern=pattern)


def server_limits(components: dict[str, Any], service: Service) -> None:
    """What this server allows, written into the request models' schemas."""
    vocab = service.tokenizer.vocab_size
    if (pattern := alphabet(service.tokenizer)) is not None:
        _texts(components, pattern)
    for name in ("CompletionRequest", "ChatCompletionRequest", "GenerateRequest"):
        schema = components.get(name, {})
        for field in ("max_tokens", "max_completion_tokens"):
            _set(schema, field, maximum=service.cap)
        bias = schema.get("properties", {}).get("logit_bias", {})
        for alt in bias.get("anyOf", []):
            if alt.get("type") == "object":
                alt["propertyNames"] = {"pattern": digits_below(vocab)}
        if not service.json_output and "response_format" in schema.get("properties", {}):
            # a vocabulary that cannot write JSON: free text is the only format this server takes
            schema["properties"]["response_format"] = {
                "anyOf": [{"$ref": "#/components/schemas/ResponseFormatText"}, {"type": "null"}],
                "description": "only text: this model's vocabulary cannot write JSON",
            }
        if "prompt" in schema.get("properties", {}):
            _token_ids(schema["properties"]["prompt"], vocab)
            if service.tokenizer.eot_id is None:  # nothing to start an empty prompt from
                _set(schema, "prompt", "string", minLength=1)
                schema["required"] = sorted({*schema.get("required", []), "prompt"})
    _token_ids(components.get("DetokenizeRequest", {}).get("properties", {}).get("tokens", {}), vocab)
    _token_ids(components.get("InsideGrammarRequest", {}).get("properties", {}).get("completion", {}), vocab)
    if not service.tools:  # a tokenizer that cannot write a call: no tools, no calls in the messages
        no_tools = {"type": "null", "description": "this model's tokenizer cannot write tool calls"}
        for name, field in (("ChatCompletionRequest", "tools"), ("ChatCompletionRequest", "tool_choice"),
                            ("ChatMessage", "tool_calls")):  # fmt: skip
            props = components.get(name, {}).get("properties", {})
            if field in props:
                props[field] = dict(no_tools)
    n_layer = service.model.config.n_layer
    for name in ("AttentionRequest", "InsideAttentionRequest", "InsideRequest"):
        _set(components.get(name, {}), "layer", minimum=-n_layer, maximum=n_layer - 1)
    if not is_seq2seq(service.model):  # a decoder has self-attention only
        for name in ("InsideAttentionRequest", "InsideRequest"):
            _set(components.get(name, {}), "kind", enum=["self"])


def document(app: FastAPI, service: Service, api_key: bool) -> None:
    """Make ``app.openapi()`` the schema described above (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = get_openapi(title=app.title, version=app.version, routes=app.routes, description=__doc__)
        components = spec.setdefault("components", {}).setdefault("schemas", {})
        for model in (ErrorDetail, ErrorResponse):
            components[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        server_limits(components, service)
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
        for path in NOT_SERVED[service.task]:
            spec.get("paths", {}).pop(path, None)
        for path, item in spec.get("paths", {}).items():
            for method, op in item.items():
                for param in op.get("parameters", []):
                    if param.get("name") == "model_id":  # the one id that is not a 404
                        param["example"] = service.model_name
                responses = op.setdefault("responses", {})
                responses.pop("422", None)
                kinds = ["post" if method == "post" else "get"] + (["model"] if "{" in path else [])
                codes = [c for k in kinds for c in RESPONSES[k]]
                if api_key and path.startswith("/v1/"):
                    codes.append("401")
                    op["security"] = [{"bearer": []}]
                for code in sorted(set(codes)):
                    responses[code] = {"description": WHY[code], "content": error}
                streamed = STREAMED.get(path)
                if streamed and "200" in responses:
                    content = responses["200"].setdefault("content", {})
                    if streamed == "always":
                        content.clear()
                    content.update(SSE)
        if api_key:
            spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
