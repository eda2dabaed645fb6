"""The HTTP API through FastAPI's test client: every field, every error case, batching."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch
from fastapi.testclient import TestClient

from gptlab import GPT
from gptlab.generate import SampleConfig, TokenEvent
from gptlab.serve import CHAT_STOP, chat_prompt, create_app
from gptlab.serve.scheduler import Channel, EndEvent, Job, Scheduler
from gptlab.serve.schemas import ChatMessage
from gptlab.tokenizers import CharTokenizer
from tests._tiny import ALPHABET
from tests.serve._serving import assert_error, sse_events, tiny_model

CAP = 48


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(ALPHABET)  # no <|endoftext|>: every request runs to max_tokens


@pytest.fixture(scope="module")
def model(tok: CharTokenizer) -> GPT:
    return tiny_model(tok.vocab_size)


@pytest.fixture(scope="module")
def client(model: GPT, tok: CharTokenizer):
    app = create_app(model, tok, model_name="tiny", max_batch=4, max_tokens_cap=CAP, max_body_bytes=4096)
    with TestClient(app) as c:
        yield c


def greedy_reference(model: GPT, tok: CharTokenizer, prompt: str, n: int) -> str:
    """Greedy decoding with a full forward pass per token (no cache, no batching)."""
    ids = tok.encode(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids[-model.config.block_size :]]))[0, -1].argmax()))
    return tok.decode(ids[len(tok.encode(prompt)) :])


# ------------------------------------------------------------------ completions
def test_completion_shape_and_usage(client, tok):
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 7, "seed": 3})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None and choice["finish_reason"] == "length"
    assert len(tok.encode(choice["text"])) == 7
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    assert "warnings" not in body


def test_greedy_equals_unbatched_reference(client, model, tok):
    r = client.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 12, "temperature": 0})
    assert r.json()["choices"][0]["text"] == greedy_reference(model, tok, "the cat", 12)


def test_concurrent_requests_are_batched_and_each_equals_its_reference(client, model, tok):
    prompts = ["a", "to be or", "ROMEO:", "xyz xyz", "hello there", "q"]
    results: dict[str, str] = {}
    steps_before = client.get("/health").json()["steps"]

    def call(p: str) -> None:
        r = client.post("/v1/completions", json={"prompt": p, "max_tokens": 10, "temperature": 0})
        results[p] = r.json()["choices"][0]["text"]

    threads = [threading.Thread(target=call, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for p in prompts:
        assert results[p] == greedy_reference(model, tok, p, 10)
    steps = client.get("/health").json()["steps"] - steps_before
    assert steps < len(prompts) * 9  # decode steps were shared between requests


def test_seed_makes_sampling_reproducible(client):
    body = {"prompt": "abc", "max_tokens": 12, "temperature": 1.0, "seed": 1234}
    a = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    b = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert a == b


def test_prompt_list_and_n(client, model, tok):
    r = client.post(
        "/v1/completions", json={"prompt": ["ab", "cd"], "n": 2, "max_tokens": 5, "temperature": 0}
    )
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    texts = [c["text"] for c in body["choices"]]
    assert texts[:2] == [greedy_reference(model, tok, "ab", 5)] * 2
    assert texts[2:] == [greedy_reference(model, tok, "cd", 5)] * 2
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 20, "total_tokens": 24}


def test_token_id_prompts_equal_text_prompts(client, tok):
    body = {"max_tokens": 6, "temperature": 0}
    text = client.post("/v1/completions", json={**body, "prompt": "hey"}).json()["choices"][0]["text"]
    ids = client.post("/v1/completions", json={**body, "prompt": tok.encode("hey")}).json()["choices"]
    assert ids[0]["text"] == text
    nested = client.post("/v1/completions", json={**body, "prompt": [tok.encode("hey")] * 2}).json()[
        "choices"
    ]
    assert [c["text"] for c in nested] == [text, text]


def test_stop_string_cuts_the_text(client):
    body = {"prompt": "it was", "max_tokens": 30, "temperature": 0}
    full = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = full[10:12]
    cut = full[: full.index(stop)]
    for value in (stop, [stop, "QQQQ"]):
        choice = client.post("/v1/completions", json={**body, "stop": value}).json()["choices"][0]
        assert choice["text"] == cut
        assert choice["finish_reason"] == "stop"


def test_null_is_the_default_wherever_openai_documents_or_null(client):
    """OpenAI's reference documents temperature, top_p, n, stream, the penalties, logprobs, echo…
    as "number or null" (or "boolean or null"), and clients send null for "unset": each such field
    takes null as its default (the same reply as without it), and the schema says it may be null."""
    from gptlab.serve.schemas import ChatCompletionRequest, CompletionRequest

    spec = client.get("/openapi.json").json()["components"]["schemas"]
    ask = {
        "/v1/completions": {"prompt": "abab", "max_tokens": 6, "seed": 3},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 6, "seed": 3},
    }
    for route, model in (
        ("/v1/completions", CompletionRequest),
        ("/v1/chat/completions", ChatCompletionRequest),
    ):
        nullable = [n for n, f in model.model_fields.items() if f.json_schema_extra is not None]
        assert {"temperature", "top_p", "n", "stream", "presence_penalty", "frequency_penalty"} <= set(
            nullable
        )
        without = client.post(route, json=ask[route]).json()["choices"]
        for name in nullable:
            prop = spec[model.__name__]["properties"][name]
            assert {"type": "null"} in prop["anyOf"], name
            r = client.post(route, json={**ask[route], name: None})
            assert r.status_code == 200, (route, name, r.text)
            assert r.json()["choices"] == without, (route, name)
    r = client.post("/v1/chat/completions", json={"messages": None})  # a field without a default is not
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = client.post("/v1/completions", json={"prompt": "a", "echo": "no"})  # strict as before
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"


def test_top_p_zero_is_the_most_probable_token(client):
    """``top_p: 0`` is valid in OpenAI's API (its reference: 0 to 1): the nucleus holds the top token
    alone, so a sampled reply is the greedy one."""
    body = {"prompt": "abab", "max_tokens": 12}
    greedy = client.post("/v1/completions", json={**body, "temperature": 0}).json()["choices"][0]["text"]
    for seed in (1, 2):
        r = client.post("/v1/completions", json={**body, "top_p": 0, "temperature": 1.5, "seed": seed})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy


def test_echo_and_zero_max_tokens(client):
    choice = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "echo": True}).json()[
        "choices"
    ][0]
    assert choice["text"].startswith("abc") and len(choice["text"]) == 6
    body = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 0}).json()
    assert body["choices"][0]["text"] == "" and body["usage"]["completion_tokens"] == 0


def test_served_sampling_options_take_effect_as_in_the_library(client, model, tok):
    """Each option changes the reply, and the reply is the library's for that option and seed: an option
    the server accepted but dropped would give the reply without it."""
    from gptlab.generate import SampleConfig, generate_text

    extras = [
        {"top_k": 2},
        {"top_p": 0.3},
        {"min_p": 0.9},
        {"repetition_penalty": 3.0},
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"beam_width": 2, "length_penalty": 0.8},
    ]
    prompt, base = "abababab", {"max_new_tokens": 24, "temperature": 1.0, "seed": 7}
    plain = generate_text(model, tok, prompt, SampleConfig(**base))
    for extra in extras:
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 24, "seed": 7, **extra})
        assert r.status_code == 200, (extra, r.text)
        served = r.json()["choices"][0]["text"]
        library = generate_text(model, tok, prompt, SampleConfig(**base, **extra))
        assert served == library, extra
        assert library != plain, extra  # the option has an effect at this seed


def test_top_k_one_is_greedy(client, model, tok):
    r = client.post("/v1/completions", json={"prompt": "the", "max_tokens": 8, "top_k": 1, "seed": 5})
    assert r.json()["choices"][0]["text"] == greedy_reference(model, tok, "the", 8)


def test_long_prompt_is_cut_from_the_left_to_leave_room_with_a_warning(client, model, tok):
    long = "ab " * 40  # 120 tokens > block_size 64
    body = client.post("/v1/completions", json={"prompt": long, "max_tokens": 3}).json()
    assert body["usage"]["prompt_tokens"] == model.config.block_size - 3  # room for the 3 new tokens
    assert any("cut to its last 61 tokens" in w for w in body["warnings"])
    # more new tokens than half the context: the prompt keeps half, the window slides past the context
    body = client.post("/v1/completions", json={"prompt": long, "max_tokens": CAP}).json()
    assert body["usage"] == {"prompt_tokens": 32, "completion_tokens": CAP, "total_tokens": 32 + CAP}
    assert any("sliding window" in w for w in body["warnings"])


# ------------------------------------------------------------------ streaming
def test_streamed_completion_matches_and_is_well_formed(client):
    body = {"prompt": "hello", "max_tokens": 9, "temperature": 0}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=stream_body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 9
    for c in chunks:
        assert c["object"] == "text_completion" and c["model"] == "tiny"
        assert set(c["choices"][0]) == {"text", "index", "logprobs", "finish_reason"}
    assert len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain


# ------------------------------------------------------------------ chat
def test_chat_template():
    messages = [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="assistant", content="hello"),
        ChatMessage(role="user", content=[{"type": "text", "text": "more"}]),
    ]
    assert chat_prompt(messages) == "system: be brief\nuser: hi\nassistant: hello\nuser: more\nassistant:"
    assert "\nuser:" in CHAT_STOP


def test_chat_completion(client, tok):
    messages = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi there"}]
    r = client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 6, "seed": 0}
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    prompt = "system: be nice\nuser: hi there\nassistant:"
    assert body["usage"]["prompt_tokens"] == len(tok.encode(prompt))


def test_chat_streaming(client):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}
    plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] in (
        "stop",
        "length",
    )
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == plain


# ------------------------------------------------------------------ gptlab endpoints
def test_gptlab_generate_streams_probabilities(client):
    with client.stream(
        "POST", "/v1/gptlab/generate", json={"prompt": "ab", "max_tokens": 5, "temperature": 0}
    ) as r:
        events = [json.loads(e) for e in sse_events(r)[:-1]]
    assert events[0] == {"type": "prompt", "tokens": ["a", "b"], "warnings": []}
    tokens = [e for e in events if e["type"] == "token"]
    assert len(tokens) == 5
    for e in tokens:
        assert 0.0 < e["prob"] <= 1.0 and len(e["top"]) == 5
        probs = [t["prob"] for t in e["top"]]
        assert probs == sorted(probs, reverse=True)
        assert e["top"][0]["text"] == e["text"] and e["top"][0]["prob"] == pytest.approx(e["prob"])  # greedy
    assert events[-1]["type"] == "done" and events[-1]["usage"]["completion_tokens"] == 5


def test_attention_endpoint(client, model):
    r = client.post("/v1/gptlab/attention", json={"text": "hello world"})
    body = r.json()
    assert body["tokens"] == list("hello world") and body["layer"] == model.config.n_layer - 1
    att = torch.tensor(body["attentions"])  # (H, T, T)
    assert att.shape == (model.config.n_head, 11, 11)
    assert torch.allclose(att.sum(-1), torch.ones(model.config.n_head, 11), atol=1e-3)
    assert (att.triu(diagonal=1) == 0).all()  # causal
    assert client.post("/v1/gptlab/attention", json={"text": "hello", "layer": 0}).json()["layer"] == 0
    assert_error(client.post("/v1/gptlab/attention", json={"text": "hello", "layer": 7}), 400, "layer")
    assert (
        len(client.post("/v1/gptlab/attention", json={"text": "ab" * 50, "max_tokens": 16}).json()["tokens"])
        == 16
    )


def test_models_health_and_playground(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"
    assert_error(client.get("/v1/models/other"), 404, "model")
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["max_batch"] == 4
    page = client.get("/")
    assert page.status_code == 200 and "gptlab" in page.text and "/static/app.js" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "/v1/gptlab/generate" in js.text and "https://" not in js.text


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": "a", "max_tokens": "9"}, "max_tokens"),
        ({"prompt": "a", "max_tokens": 1.5}, "max_tokens"),
        ({"prompt": "a", "temperature": "hot"}, "temperature"),
        ({"prompt": "a", "temperature": -1}, "temperature"),
        ({"prompt": "a", "top_p": -0.1}, "top_p"),
        ({"prompt": "a", "top_p": 1.5}, "top_p"),
        ({"prompt": "a", "n": True}, "n"),
        ({"prompt": "a", "n": 0}, "n"),
        ({"prompt": "a", "stream": "yes"}, "stream"),
        ({"prompt": "a", "stop": 3}, "stop"),
        ({"prompt": "a", "seed": "x"}, "seed"),
        ({"prompt": "a", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "a", "beam_width": 0}, "beam_width"),
        ({"prompt": "a", "max_tokens": CAP + 1}, "max_tokens"),
        ({"prompt": "\u00e9"}, "prompt"),
        ({"prompt": [10_000]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
    ],
)
def test_bad_completion_fields_are_400(client, body, param):
    assert_error(client.post("/v1/completions", json=body), 400, param)


def test_bad_combination_is_400(client):
    err = assert_error(client.post("/v1/completions", json={"prompt": "a", "beam_width": 2, "top_k": 3}), 400)
    assert "beam" in err["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": CAP + 1}, "max_tokens"),
    ],
)
def test_bad_chat_fields_are_400(client, body, param):
    assert_error(client.post("/v1/chat/completions", json=body), 400, param)


def test_a_400_names_the_part_of_a_list_or_object_that_is_wrong(client):
    """A field of several types (content: a string or content parts; stop; tool_choice) sent as a list
    or an object that only one of its types can be: the 400 names the wrong part and quotes it, and
    never quotes a value the client did not send."""
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]}
    err = assert_error(client.post("/v1/chat/completions", json=chat), 400, "messages.0.content.1.type")
    assert "'text'" in err["message"] and '"image_url"' in err["message"], err
    err = assert_error(
        client.post("/v1/completions", json={"prompt": "a", "stop": ["ok", ""]}), 400, "stop.1"
    )
    assert "at least 1 character" in err["message"], err
    named = {
        "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": {"type": "function", "function": {}},
    }
    err = assert_error(client.post("/v1/chat/completions", json=named), 400, "tool_choice.function.name")
    assert "required" in err["message"].lower(), err
    err = assert_error(client.post("/v1/completions", json={"prompt": ["a", 3]}), 400, "prompt")
    assert err["message"].startswith("prompt: must be a string, a list") and "(got" not in err["message"], err
    err = assert_error(
        client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": 5}]}), 400
    )
    assert err["param"] == "messages.0.content" and err["message"].endswith("(got 5)"), err


def test_malformed_json_and_non_objects_are_400(client):
    for raw in (b"{", b"not json", b"\xff\xfe", b"[1, 2]", b"null", b""):
        err = assert_error(
            client.post("/v1/completions", content=raw, headers={"content-type": "application/json"}), 400
        )
        assert err["code"] == "invalid_json"


def test_unknown_model_is_404(client):
    for path, body in (
        ("/v1/completions", {"prompt": "a"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}),
    ):
        err = assert_error(client.post(path, json={**body, "model": "gpt-4"}), 404, "model")
        assert err["code"] == "model_not_found"


def test_oversized_body_is_413(client):
    big = json.dumps({"prompt": "a" * 5000}).encode()
    assert_error(
        client.post("/v1/completions", content=big, headers={"content-type": "application/json"}), 413
    )

    def chunks():  # no content-length: the limit is counted while reading
        yield big[:3000]
        yield big[3000:]

    assert_error(
        client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"}), 413
    )


def test_unknown_route_and_method_use_the_error_shape(client):
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/completions"), 405)


def test_api_key(model, tok):
    app = create_app(model, tok, model_name="tiny", max_batch=2, api_key="sekrit")
    with TestClient(app) as c:
        body = {"prompt": "a", "max_tokens": 2}
        assert assert_error(c.post("/v1/completions", json=body), 401)["code"] == "invalid_api_key"
        assert_error(c.post("/v1/completions", json=body, headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(c.get("/v1/models", headers={"Authorization": "Basic sekrit"}), 401)
        assert (
            c.post("/v1/completions", json=body, headers={"Authorization": "Bearer sekrit"}).status_code
            == 200
        )
        assert c.get("/health").status_code == 200 and c.get("/").status_code == 200


def test_internal_errors_are_500_in_the_error_shape(tok):
    class Broken(torch.nn.Module):  # a model whose forward pass fails
        def __init__(self, config):
            super().__init__()
            self.inner = tiny_model(tok.vocab_size)
            self.config, self.positional = config, self.inner.positional
            self.device, self.dtype = self.inner.device, self.inner.dtype

        def run(self, *args, **kwargs):
            raise RuntimeError("boom")

    broken = Broken(tiny_model(tok.vocab_size).config)
    with TestClient(
        create_app(broken, tok, model_name="tiny", max_batch=2), raise_server_exceptions=False
    ) as c:
        err = assert_error(c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}), 500)
        assert err["type"] == "server_error"
        with c.stream("POST", "/v1/completions", json={"prompt": "a", "max_tokens": 2, "stream": True}) as r:
            events = sse_events(r)
        assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
        assert c.get("/health").json()["status"] == "ok"  # the scheduler survived


# ------------------------------------------------------------------ the scheduler
def test_a_slow_consumer_does_not_block_others(model, tok):
    """A job whose channel is full is paused; another job still runs to completion."""

    async def scenario() -> tuple[int, list]:
        sched = Scheduler(model, tok, max_batch=2)
        loop = asyncio.get_running_loop()
        slow = Job(tok.encode("ab"), SampleConfig(max_new_tokens=40, temperature=0), Channel(loop, limit=3))
        fast = Job(tok.encode("cd"), SampleConfig(max_new_tokens=20, temperature=0), Channel(loop, limit=64))
        sched.submit(slow)
        sched.submit(fast)
        got = []
        while not any(isinstance(e, EndEvent) for e in got):
            got += await asyncio.wait_for(fast.channel.get(), 30)
        queued = len(slow.channel)
        slow.cancel()
        await asyncio.sleep(0.05)
        stats = sched.stats()
        sched.close()
        return queued, got, stats

    queued, got, stats = asyncio.run(scenario())
    assert sum(isinstance(e, TokenEvent) for e in got) == 20
    assert queued <= 3  # the slow job never ran ahead of its bounded channel
    assert stats["active"] == 0  # the cancelled job left its slot


# ------------------------------------------------------------------ the command
def test_cli_serve_bad_input_is_one_error_line(tmp_path, capsys):
    from gptlab.cli import main
    from gptlab.serve.launch import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.1")
    assert main(["serve", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert main(["serve", str(tmp_path), "--max-batch", "0"]) == 2
    assert "--max-batch" in capsys.readouterr().err


def test_best_of_and_suffix_are_refused_unless_off(client):
    """OpenAI's legacy ``best_of`` and ``suffix``: their "off" values (1, "", null) are taken, and a request
    for a best-of choice or a fill-in-the-middle is a 400 that names the field, never a reply that
    silently is neither."""
    body = {"prompt": "abab", "max_tokens": 4, "temperature": 0}
    plain = client.post("/v1/completions", json=body).json()["choices"]
    for off in ({"best_of": 1}, {"best_of": None}, {"best_of": 1.0}, {"suffix": ""}, {"suffix": None}):
        r = client.post("/v1/completions", json={**body, **off})
        assert r.status_code == 200 and r.json()["choices"] == plain, off
    for on, words in (({"best_of": 3}, "best_of above 1"), ({"suffix": "ba"}, "fill-in-the-middle")):
        r = client.post("/v1/completions", json={**body, **on})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == next(iter(on)) and words in error["message"], r.text
    spec = client.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"type": "integer", "const": 1} in spec["best_of"]["anyOf"]
    assert {"type": "string", "const": ""} in spec["suffix"]["anyOf"]
