"""OpenAI's logprobs and logit_bias, the limits endpoint, long chats, edge cases, the service
without HTTP, and beam search on the prompt ids sent."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch
from fastapi.testclient import TestClient

from gptlab.generate import SampleConfig, beam_search
from gptlab.serve import Service, create_app
from gptlab.serve.scheduler import EndEvent
from gptlab.serve.schemas import ChatCompletionRequest, CompletionRequest
from gptlab.tokenizers import CharTokenizer
from tests._tiny import ALPHABET
from tests.serve._serving import assert_error, sse_events, tiny_model

CAP = 48


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(ALPHABET)


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(tok.vocab_size)


@pytest.fixture(scope="module")
def client(model, tok):
    with TestClient(create_app(model, tok, model_name="tiny", max_batch=4, max_tokens_cap=CAP)) as c:
        yield c


def playground_probs(client, body: dict) -> list[dict]:
    with client.stream("POST", "/v1/gptlab/generate", json={**body, "top_n": 5}) as r:
        return [e for e in map(json.loads, sse_events(r)[:-1]) if e["type"] == "token"]


# ------------------------------------------------------------------ logprobs
def test_completion_logprobs_shape_and_values_equal_the_playground(client, tok):
    body = {"prompt": "to be", "max_tokens": 8, "temperature": 0.8, "top_k": 20, "seed": 4}
    choice = client.post("/v1/completions", json={**body, "logprobs": 3}).json()["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert "".join(lp["tokens"]) == choice["text"] and len(lp["tokens"]) == 8
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(8)]
    for value, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert value <= 0 and len(top) <= 3 and max(top.values()) >= value
    shaded = playground_probs(client, body)
    assert [e["text"] for e in shaded] == lp["tokens"]
    assert lp["token_logprobs"] == pytest.approx([math.log(e["prob"]) for e in shaded], abs=1e-6)
    assert (
        client.post("/v1/completions", json={**body, "logprobs": 0}).json()["choices"][0]["logprobs"][
            "top_logprobs"
        ]
        == [{}] * 8
    )
    assert_error(client.post("/v1/completions", json={**body, "logprobs": 6}), 400, "logprobs")
    echoed = client.post("/v1/completions", json={**body, "logprobs": 2, "echo": True}).json()["choices"][0]
    assert echoed["logprobs"]["token_logprobs"][0] is None  # echo + logprobs: tests/serve/test_serve_echo.py


def test_streamed_completion_logprobs_equal_the_whole_ones(client):
    body = {"prompt": "abc", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        chunks = [json.loads(e)["choices"][0] for e in sse_events(r)[:-1]]
    parts = [c["logprobs"] for c in chunks if c["logprobs"]]
    assert [t for p in parts for t in p["tokens"]] == whole["tokens"]
    assert [t for p in parts for t in p["token_logprobs"]] == whole["token_logprobs"]
    assert [t for p in parts for t in p["text_offset"]] == whole["text_offset"]


def test_chat_logprobs_shape_streaming_too(client, tok):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}
    choice = client.post("/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 4}).json()[
        "choices"
    ][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 6 and choice["logprobs"]["refusal"] is None
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(item["bytes"]).decode() == item["token"] and len(item["top_logprobs"]) == 4
        assert item["top_logprobs"][0]["logprob"] == pytest.approx(item["logprob"])  # greedy: the top one
    with client.stream(
        "POST", "/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 4, "stream": True}
    ) as r:
        chunks = [json.loads(e)["choices"][0] for e in sse_events(r)[:-1]]
    streamed = [item for c in chunks if c["logprobs"] for item in c["logprobs"]["content"]]
    # the same tokens; the values to float rounding (the 2nd request reuses the 1st's cached prefix)
    assert [i["token"] for i in streamed] == [i["token"] for i in content]
    assert [i["logprob"] for i in streamed] == pytest.approx([i["logprob"] for i in content], abs=1e-5)
    assert client.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"] is None
    assert_error(client.post("/v1/chat/completions", json={**body, "top_logprobs": 2}), 400, "top_logprobs")
    assert_error(client.post("/v1/chat/completions", json={**body, "logprobs": True, "beam_width": 2}), 400)


# ------------------------------------------------------------------ logit_bias
def test_logit_bias_forces_and_bans_tokens_in_completions_and_chat(client, tok):
    z = tok.encode("z")[0]
    body = {"prompt": "hello", "max_tokens": 10, "seed": 1, "logit_bias": {str(z): 100}}
    assert client.post("/v1/completions", json=body).json()["choices"][0]["text"] == "z" * 10
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "logit_bias": {str(z): 100}}
    assert (
        client.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"] == "z" * 5
    )
    greedy = {"prompt": "hello", "max_tokens": 10, "temperature": 0}
    free = client.post("/v1/completions", json=greedy).json()["choices"][0]["text"]
    banned = {str(i): -100 for i in tok.encode(free[0])}
    text = client.post("/v1/completions", json={**greedy, "logit_bias": banned}).json()["choices"][0]["text"]
    assert free[0] not in text
    for bad in ({"x": 1}, {"9999": 1}, {str(z): 101}, {str(z): "a"}, [1]):
        err = assert_error(client.post("/v1/completions", json={**greedy, "logit_bias": bad}), 400)
        assert err["param"].startswith("logit_bias")


# ------------------------------------------------------------------ limits, long chats, edge cases
def test_limits_endpoint_tells_what_the_server_refuses(client, model, tok):
    limits = client.get("/v1/gptlab/limits").json()
    assert limits["max_tokens"] == CAP and limits["context_length"] == model.config.block_size
    assert limits["max_n"] == 16 and limits["max_choices"] == 64 * 16 and limits["max_logprobs"] == 5
    assert all(v <= CAP for v in limits["default_max_tokens"].values())
    ok = client.post("/v1/completions", json={"prompt": "a", "max_tokens": limits["max_tokens"]})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == CAP
    too_many = {"prompt": "a", "max_tokens": limits["max_tokens"] + 1}
    assert_error(client.post("/v1/completions", json=too_many), 400, "max_tokens")
    assert_error(client.post("/v1/completions", json={"prompt": "a", "n": limits["max_n"] + 1}), 400, "n")
    with TestClient(create_app(model, tok, model_name="tiny", max_batch=1)) as default:
        assert default.get("/v1/gptlab/limits").json()["max_tokens"] == 1024  # the window slides past 64


def test_a_long_chat_drops_its_oldest_turns_and_keeps_the_system_message(model, tok):
    service = Service(model, tok, model_name="tiny", max_batch=1)
    try:
        turns = [{"role": "system", "content": "be kind"}]
        for i in range(11):
            turns.append(
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {'abcdefghijk'[i]} xxxxx"}
            )
        req = ChatCompletionRequest.model_validate({"messages": turns, "max_tokens": 10})
        warnings: list[str] = []
        ids = service.chat_ids(req.messages, 10, warnings)
        text = tok.decode(ids)
        assert len(ids) <= 64 - 10 and text.count("\n") == 2  # system, the last turn, the open turn
        assert text.startswith("system: be kind\n") and text.endswith("\nuser: turn k xxxxx\nassistant:")
        assert "turn a" not in text and "oldest message" in warnings[0]
    finally:
        service.close()


def test_deeply_nested_json_and_too_many_prompts_are_400(model, tok):
    app = create_app(model, tok, model_name="tiny", max_batch=2, api_key="k")
    auth = {"Authorization": "Bearer k", "content-type": "application/json"}
    with TestClient(app) as c:
        nested = b"[" * 50_000 + b"]" * 50_000
        err = assert_error(c.post("/v1/completions", content=nested, headers=auth), 400)
        assert "nested" in err["message"]
        deep_field = (
            json.dumps({"prompt": "a"})[:-1].encode() + b', "stop": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        )
        assert_error(c.post("/v1/completions", content=deep_field, headers=auth), 400)
        many = json.dumps({"prompt": ["ab"] * 5000, "max_tokens": 1}).encode()
        err = assert_error(c.post("/v1/completions", content=many, headers=auth), 400, "prompt")
        assert "1 to 64 strings" in err["message"]
        assert c.get("/health").json()["status"] == "ok"


# ------------------------------------------------------------------ the service, without HTTP
def test_the_service_answers_without_http(model, tok):
    async def scenario() -> tuple[str, EndEvent, list[str]]:
        service = Service(model, tok, model_name="tiny", max_batch=2, max_tokens_cap=CAP)
        try:
            req = service.parse(
                b'{"prompt": "the cat", "max_tokens": 7, "temperature": 0}', CompletionRequest
            )
            gen = service.completion(req)
            text, end = "", None
            async for event in gen.events():
                if isinstance(event, EndEvent):
                    end = event
                else:
                    text += event.text
            return text, end, gen.all_warnings([end])
        finally:
            service.close()

    text, end, warnings = asyncio.run(scenario())
    assert end.finish_reason == "length" and end.completion_tokens == 7 and len(text) == 7 and warnings == []
    direct = gptlab_greedy(model, tok, "the cat", 7)
    assert text == direct


def gptlab_greedy(model, tok, prompt: str, n: int) -> str:
    from gptlab.generate import generate_text

    return generate_text(model, tok, prompt, SampleConfig(max_new_tokens=n, temperature=0))


# ------------------------------------------------------------------ beam search on the ids sent
def test_server_beam_search_runs_on_the_prompt_ids_sent(gpt2_files):
    from gptlab.tokenizers import GPT2Tokenizer

    gpt2 = GPT2Tokenizer.from_files(*gpt2_files)
    ids = [71, 11109]
    assert gpt2.encode(gpt2.decode(ids)) == [31373]  # decode → re-encode would change the prompt
    torch.manual_seed(0)
    model = tiny_model(gpt2.vocab_size, block_size=32)
    config = SampleConfig(max_new_tokens=5, beam_width=3, stop_tokens=[gpt2.eot_id])
    expected, _ = beam_search(model, ids, config, gpt2)
    other, _ = beam_search(model, [31373], config, gpt2)
    assert expected != other  # the two prompts lead to different beams on this model
    with TestClient(create_app(model, gpt2, model_name="g", max_batch=2)) as c:
        r = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 5, "beam_width": 3})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == gpt2.decode(expected)


def test_a_long_chat_with_a_strict_template_keeps_turns_that_start_with_the_user(model, tok):
    """A template that refuses a chat not starting with a user turn (like Llama 2's) still works:
    a dropped user message takes the replies after it along."""
    from gptlab.tokenizers.chat import ChatTemplate

    strict = (
        "{% for m in messages %}{% if m.role != 'system' and loop.index0 > 0 and messages[loop.index0 - 1].role "
        "== 'system' and m.role != 'user' %}{{ raise_exception('a chat starts with a user turn') }}{% endif %}"
        "{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    )
    service = Service(model, tok, model_name="tiny", max_batch=1)
    service.chat_template = ChatTemplate(strict, "strict")
    try:
        turns = [{"role": "system", "content": "be kind"}]
        turns += [
            {"role": ("user", "assistant")[i % 2], "content": f"turn {c} xxxxx"}
            for i, c in enumerate("abcdefg")
        ]
        req = ChatCompletionRequest.model_validate({"messages": turns, "max_tokens": 10})
        warnings: list[str] = []
        text = tok.decode(service.chat_ids(req.messages, 10, warnings))
        assert text.startswith("system: be kind\nuser: ") and text.endswith("user: turn g xxxxx\nassistant:")
        assert "oldest message" in warnings[0]
        short = ChatCompletionRequest.model_validate({"messages": turns[:2], "max_tokens": 10})
        fits: list[str] = []
        service.chat_ids(short.messages, 10, fits)
        assert fits == []  # nothing dropped, nothing said
        refused: list[str] = []  # dropping would leave an assistant turn first: cut from the left instead
        ids = service.chat_ids(
            ChatCompletionRequest.model_validate({"messages": turns[:3]}).messages, 10, refused
        )
        assert len(ids) == 54 and "cut to its last 54 tokens" in refused[0]
    finally:
        service.close()
