"""Request bodies of the HTTP API, as pydantic models (OpenAI's field names and defaults).

Validation is strict (``"5"`` is not an int, ``true`` is not a number, NaN and ±inf are
not numbers), as in OpenAI's API, except that a whole float is an integer (``"n": 1.0``,
as JSON clients send it); a bad value becomes a 400 with the OpenAI error object naming
the field. An option OpenAI documents as "or null" (``"temperature": null``) takes null
as its default, as OpenAI's API does (``OR_NULL``). Fields the API does not know are
ignored, so clients that send extra OpenAI options work. Every number has the bounds it is checked against, stated in the OpenAPI
schema: none of them can make a NaN, an infinity, an overflow or a division by zero in
the generation loop. A new field is one line here: the routes and the schema follow.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from gptlab.tokenizers.json_writing import SAFE_INTEGER

# The limits of a request body (also reported by GET /v1/gptlab/limits).
MAX_N = 16  # choices per prompt
MAX_LOGPROBS = 5  # completions: logprobs
MAX_TOP_LOGPROBS = 20  # chat: top_logprobs
MAX_TOP_N = 20  # the playground's alternatives per token
MAX_ATTENTION_TOKENS = 512
MAX_TEXT_CHARS = 1 << 16  # one text of the Inside and Fill routes
MAX_INSIDE_TOKENS = 128  # the Inside view (serve/inside_routes.py) keeps every layer's T×T weights
MAX_PROMPTS = 64  # prompts in one completions request
MAX_STOP = 16  # stop strings
TEMPERATURE_RANGE = (1e-4, 100.0)  # or exactly 0 (greedy): below 1e-4 sampling is greedy in all but name
PENALTY_RANGE = (0.01, 100.0)  # repetition_penalty (1 = off)
LENGTH_PENALTY_RANGE = (-10.0, 10.0)  # beam search's α
# JSON's exact integers (I-JSON): every client and validator agrees
SEED_RANGE = (-SAFE_INTEGER, SAFE_INTEGER)
MAX_TOP_K = 2**31 - 1
MAX_TOOLS = 128  # tools in one chat request, calls in one message (OpenAI's limit)


def _whole(value: Any) -> Any:
    """A float with no fractional part is that integer (JSON has one number type)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: ``Annotated[int, Field(ge=…, le=…), WHOLE]``: an integer in ``[ge, le]`` that also accepts a whole
#: float (``1.0``); written out at each field, so that a type checker reads it as the type it is
WHOLE = BeforeValidator(_whole)


def _greedy_or_sampled(value: float) -> float:
    low, high = TEMPERATURE_RANGE
    if value != 0 and not low <= value <= high:
        raise ValueError(f"must be 0 (greedy) or between {low:g} and {high:g}")
    return value


#: 0, or a temperature in ``TEMPERATURE_RANGE``
Temperature = Annotated[
    float,
    AfterValidator(_greedy_or_sampled),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "const": 0},
                {"type": "number", "minimum": TEMPERATURE_RANGE[0], "maximum": TEMPERATURE_RANGE[1]},
            ],
            "description": "0 = greedy",
        }
    ),
]
StopString = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[
    list[Annotated[int, Field(ge=0), WHOLE]], Field(min_length=1)
]  # each < the vocabulary (the server's schema)


def either(*alternatives: dict[str, Any]) -> dict[str, Any]:
    """A rule across fields, for the schema: the body matches one of ``alternatives`` (JSON schemas)."""
    return {"anyOf": list(alternatives)}


def fields(required: tuple[str, ...] = (), /, **properties: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema constraining some fields of a body (the others are free)."""
    return {"properties": properties, **({"required": list(required)} if required else {})}


#: beam search is deterministic: no truncation (their "off" values are fine) and no logprobs
NO_BEAM = fields(beam_width={"maximum": 1})
#: a JSON reply (``response_format`` json_object or json_schema) is sampled, never beam-searched
TEXT_FORMAT = fields(
    response_format={
        "anyOf": [{"type": "null"}, {"type": "object", "properties": {"type": {"const": "text"}}}]
    }
)
TRUNCATION_OFF: dict[str, dict[str, Any]] = {
    "top_k": {"enum": [0, None]},
    "top_p": {"enum": [1, None]},
    "min_p": {"enum": [0, None]},
}


def _or_null(schema: dict[str, Any]) -> None:
    """The schema of an ``OR_NULL`` field: its own, or ``{"type": "null"}``."""
    own = {k: schema.pop(k) for k in list(schema) if k not in ("default", "title", "description")}
    schema["anyOf"] = [*(own["anyOf"] if list(own) == ["anyOf"] else [own]), {"type": "null"}]


#: ``Annotated[float, …, OR_NULL] = default``: a field that also takes null, meaning its default, as
#: OpenAI's API takes ``"temperature": null`` or ``"n": null`` (its reference documents them as
#: "number or null"); the schema says so, and the model sees the default (``Strict``)
OR_NULL = Field(json_schema_extra=_or_null)


class Strict(BaseModel):
    """The configuration of every request body: strict types, finite numbers, unknown fields ignored,
    and null taken as the default where a field is ``OR_NULL``."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nullable = {n for n, f in cls.model_fields.items() if f.json_schema_extra is _or_null}
            if any(data.get(n, 0) is None for n in nullable):
                return {k: v for k, v in data.items() if not (v is None and k in nullable)}
        return data


class StreamOptions(Strict):
    """OpenAI's ``stream_options``."""

    include_usage: bool = False


#: what the ``schema`` of a ``json_schema`` response format is documented as (any JSON Schema object;
#: the keywords the grammar engine implements are listed in docs/guide/serving.md)
SCHEMA_OBJECT = {
    "type": "object",
    "description": (
        "a JSON Schema (draft 2020-12 keywords: type, properties, required, additionalProperties, items, "
        "prefixItems, minItems, maxItems, enum, const, minimum, maximum, exclusiveMinimum, exclusiveMaximum, "
        "multipleOf, minLength, maxLength, pattern, format, anyOf, oneOf, allOf, $ref, $defs); a keyword "
        "the engine cannot enforce is a 400 naming it"
    ),
}
MAX_SCHEMA_NAME = 64


class ResponseFormatText(Strict):
    """``{"type": "text"}``: free text (the default)."""

    type: Literal["text"]


class ResponseFormatJSONObject(Strict):
    """``{"type": "json_object"}``: the reply is one JSON object (any keys and values)."""

    type: Literal["json_object"]


class JSONSchemaFormat(Strict):
    """OpenAI's ``json_schema`` object: the schema the reply is valid against, its name and strictness.

    ``strict`` is accepted either way and the schema is always enforced (gptlab's grammar never lets
    the reply leave it); without ``schema`` the reply is any JSON object.
    """

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)

    name: str = Field(min_length=1, max_length=MAX_SCHEMA_NAME, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: Annotated[dict[str, Any], WithJsonSchema(SCHEMA_OBJECT)] | None = Field(
        default=None, alias="schema"
    )
    strict: bool | None = None


class ResponseFormatJSONSchema(Strict):
    """``{"type": "json_schema", "json_schema": {...}}``: the reply is JSON valid against the schema."""

    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


#: OpenAI's ``response_format`` (structured output)
ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema, Field(discriminator="type")
]


class SamplingFields(Strict):
    """The sampling options shared by every generating endpoint.

    OpenAI's: ``max_tokens``, ``temperature``, ``top_p``, ``n``, ``stop``, ``seed``,
    ``frequency_penalty``, ``presence_penalty``. gptlab's extras: ``top_k``, ``min_p``,
    ``repetition_penalty``, ``beam_width``, ``length_penalty``, ``early_stopping``.
    ``logit_bias`` maps token ids (as strings, like OpenAI) to a bias in [-100, 100].
    ``response_format`` (OpenAI's structured output): ``text``, ``json_object`` or ``json_schema``.
    """

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=0), WHOLE] | None = None  # ≤ the server's cap (its schema says which)
    temperature: Annotated[Temperature, OR_NULL] = 1.0
    # p = 0: the nucleus is the most probable token alone (and any tied with it), as in OpenAI's API
    top_p: Annotated[float, Field(ge=0.0, le=1.0), OR_NULL] = 1.0
    top_k: Annotated[int, Field(ge=0, le=MAX_TOP_K), WHOLE] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0), OR_NULL] = 0.0
    n: Annotated[int, Field(ge=1, le=MAX_N), WHOLE, OR_NULL] = 1
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    seed: Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1]), WHOLE] | None = None
    stream: Annotated[bool, OR_NULL] = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0), OR_NULL] = 0.0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0), OR_NULL] = 0.0
    repetition_penalty: Annotated[float, Field(ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1]), OR_NULL] = 1.0
    beam_width: Annotated[int, Field(ge=1, le=MAX_N), WHOLE, OR_NULL] = 1
    length_penalty: Annotated[
        float, Field(ge=LENGTH_PENALTY_RANGE[0], le=LENGTH_PENALTY_RANGE[1]), OR_NULL
    ] = 1.0
    early_stopping: Annotated[bool, OR_NULL] = True
    user: str | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None  # keys: token ids
    response_format: ResponseFormat | None = (
        None  # structured output: the reply is JSON (generate/grammar.py)
    )

    def json_schema(self) -> dict[str, Any] | None:
        """The schema ``response_format`` asks the reply to follow (``{"type": "object"}`` for a JSON
        object), or None for free text."""
        fmt = self.response_format
        if isinstance(fmt, ResponseFormatJSONSchema):
            return fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {"type": "object"}
        if isinstance(fmt, ResponseFormatJSONObject):
            return {"type": "object"}
        return None

    def stop_list(self) -> list[str]:
        """``stop`` as a list (OpenAI allows a string, a list of up to 4, or null)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _one_draw(value: int) -> int:
    if value != 1:
        raise ValueError(
            "gptlab draws no extra completions to choose the best from (best_of above 1); "
            "leave it at 1 (or null) and ask for n completions"
        )
    return value


def _no_suffix(value: str) -> str:
    if value:
        raise ValueError(
            "text after the insertion (fill-in-the-middle) is not supported; leave suffix empty (or null)"
        )
    return value


#: OpenAI's legacy ``best_of`` at its "off" value, 1 (or null): a larger one is a 400 that says so
BestOf = Annotated[int, WHOLE, AfterValidator(_one_draw), WithJsonSchema({"type": "integer", "const": 1})]
#: OpenAI's legacy ``suffix`` at its "off" value, "" (or null): text there is a 400 that says so
Suffix = Annotated[str, AfterValidator(_no_suffix), WithJsonSchema({"type": "string", "const": ""})]


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of strings, or token ids. OpenAI's
    ``best_of`` and ``suffix`` are taken at their "off" values only (``BestOf``, ``Suffix``), so that a
    request for a best-of choice or a fill-in-the-middle is told so rather than answered otherwise."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                either(NO_BEAM, fields(**TRUNCATION_OFF, logprobs={"type": "null"})),
                either(NO_BEAM, TEXT_FORMAT),
            ]
        }
    )

    prompt: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    ) = ""
    echo: Annotated[bool, OR_NULL] = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS), WHOLE] | None = None
    best_of: BestOf | None = None
    suffix: Suffix | None = None


class ContentPart(Strict):
    """One of OpenAI's content parts: a text-only model takes ``{"type": "text", "text": ...}``."""

    type: Literal["text"]
    text: str


def _object_schema(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("type") != "object":
        raise ValueError('must be a JSON Schema of an object: {"type": "object", "properties": {...}}')
    return value


#: a function's ``parameters``: a JSON Schema whose top is an object
ParametersSchema = Annotated[
    dict[str, Any],
    AfterValidator(_object_schema),
    WithJsonSchema(
        {
            "type": "object",
            "properties": {"type": {"const": "object"}},
            "required": ["type"],
            "description": "a JSON Schema of the arguments: an object",
        }
    ),
]


class FunctionDefinition(Strict):
    """OpenAI's ``tools[i].function``: a name, what it does, and its arguments' JSON Schema."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: ParametersSchema | None = None  # None: no arguments
    strict: bool | None = None  # the arguments always follow the schema here (docs/guide/serving.md)


class ToolDefinition(Strict):
    """One tool of ``tools``: a function."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Strict):
    name: str


class NamedToolChoice(Strict):
    """``tool_choice`` naming one function: the reply calls it."""

    type: Literal["function"]
    function: FunctionName


class FunctionCall(Strict):
    """A call as the assistant made it: ``arguments`` is JSON text."""

    name: str
    arguments: str


class ToolCall(Strict):
    """One of an assistant message's ``tool_calls``."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(Strict):
    """One message of a chat: its role and its text (a string or OpenAI's content parts); an assistant's
    message may hold ``tool_calls`` (its content then may be null), a ``tool`` message answers the call
    ``tool_call_id``."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [  # a tool message names its call; only an assistant's holds calls (a 400 otherwise)
                either(
                    fields(role={"not": {"const": "tool"}}),
                    fields(("tool_call_id",), tool_call_id={"type": "string"}),
                ),
                either(fields(role={"const": "assistant"}), fields(tool_calls={"type": "null"})),
            ]
        }
    )

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text; a list of content parts keeps the ``{"type": "text"}`` ones."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                either(
                    fields(top_logprobs={"type": "null"}), fields(("logprobs",), logprobs={"const": True})
                ),
                either(NO_BEAM, fields(**TRUNCATION_OFF, logprobs={"enum": [False, None]})),
                either(NO_BEAM, TEXT_FORMAT),
                either(fields(tool_choice={"type": "null"}), fields(("tools",), tools={"type": "array"})),
                either(NO_BEAM, fields(tools={"type": "null"})),  # a call is sampled under its grammar
                either(fields(tools={"type": "null"}), TEXT_FORMAT),  # one grammar per reply
            ]
        }
    )

    messages: list[ChatMessage] = Field(min_length=1)
    # names are unique (a 400 names the second); the schema can say so only of identical tools
    tools: (
        Annotated[
            list[ToolDefinition],
            Field(min_length=1, max_length=MAX_TOOLS, json_schema_extra={"uniqueItems": True}),
        ]
        | None
    ) = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # needs tools
    parallel_tool_calls: Annotated[bool, OR_NULL] = True
    max_completion_tokens: Annotated[int, Field(ge=0), WHOLE] | None = None
    logprobs: Annotated[bool, OR_NULL] = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), WHOLE] | None = None


class GenerateRequest(SamplingFields):
    """``POST /v1/gptlab/generate``: one prompt, streamed token by token with probabilities."""

    prompt: str = ""
    top_n: Annotated[int, Field(ge=0, le=MAX_TOP_N), WHOLE] = 5
    beam_width: Annotated[int, Field(ge=1, le=1), WHOLE] = (
        1  # the playground shows each token as it is drawn: no beam search
    )


class AttentionRequest(Strict):
    """``POST /v1/gptlab/attention``: the attention weights of one layer for ``text``."""

    model: str | None = None
    text: str = Field(min_length=1)
    layer: Annotated[int, Field(), WHOLE] = -1  # in [-n_layer, n_layer) (the server's schema says which)
    max_tokens: Annotated[int, Field(ge=1, le=MAX_ATTENTION_TOKENS), WHOLE] = (
        128  # keep the last this many tokens
    )
