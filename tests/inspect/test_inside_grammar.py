"""Inside under a grammar (gptlab.inspect.inside_grammar and POST /v1/gptlab/inside/grammar): at each step
the allowed set is the language's next tokens, the probabilities are the model's renormalised under the
mask, the reply's tokens are in the set, and what the engine cannot compile is a 400."""

from __future__ import annotations

import json
import re

import pytest
import torch
from fastapi.testclient import TestClient

from gptlab.errors import GptlabError
from gptlab.generate.grammar import Constraint
from gptlab.inspect.inside_grammar import constraint_config, grammar_steps, reply_stops
from gptlab.serve import create_app
from gptlab.tokenizers import CharTokenizer
from tests._structured import JSON_ALPHABET, SCHEMAS, validate
from tests._tiny import tiny_model

ROUTE = "/v1/gptlab/inside/grammar"
DIGITS = "0123456789"


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(JSON_ALPHABET, special_tokens=["<|endoftext|>"])


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(vocab_size=tok.vocab_size, block_size=64, init_std=0.2)


@pytest.fixture(scope="module")
def client(model, tok):
    with TestClient(create_app(model, tok, model_name="tiny", max_batch=2)) as c:
        yield c


def ids_of(tok: CharTokenizer, chars: str) -> set[int]:
    return {tok.encode(c)[0] for c in chars}


def test_digits_regex_allows_exactly_the_digits_and_the_end_where_complete(client, tok) -> None:
    r = client.post(ROUTE, json={"text": "number:", "regex": "[0-9]+", "completion": "4207", "top": 50})
    assert r.status_code == 200, r.text
    body = r.json()
    digits, eot = ids_of(tok, DIGITS), tok.eot_id
    assert body["generated"] is False and body["constraint"] == "regex" and body["rejected_at"] is None
    assert [t["token"] for t in body["tokens"]] == list("4207")
    assert len(body["steps"]) == 5  # one per token, then what may come after the whole text
    for t, step in enumerate(body["steps"]):
        allowed = {e["id"] for e in step["top_allowed"]}
        want = digits | ({eot} if t > 0 else set())  # the reply may end once one digit is written
        assert allowed == want and step["allowed"] == len(want)
        assert step["accepting"] is (t > 0)
        assert sum(e["p_masked"] for e in step["top_allowed"]) == pytest.approx(1.0, abs=1e-5)
        for e in step["top_allowed"]:
            assert e["p_masked"] == pytest.approx(e["p"] / step["allowed_mass"], rel=1e-4)
        assert [e["p"] for e in step["top_allowed"]] == sorted(
            (e["p"] for e in step["top_allowed"]), reverse=True
        )
        for e in step["top_model"]:
            assert e["allowed"] is (e["id"] in want)
        assert step["overruled"] is (step["model_choice"]["id"] not in want)
        if t < 4:
            assert step["token"]["allowed"] and step["token"]["id"] in allowed
        else:
            assert step["token"] is None


def test_the_numbers_equal_a_direct_computation(model, tok) -> None:
    config = constraint_config(json_schema=SCHEMAS["flat"])
    reply = '{"name": "ab", "age": 7, "ok": true}'
    view = grammar_steps(model, tok, "record:", reply, config, top=5)
    x, y = tok.encode("record:"), tok.encode(reply)
    with torch.no_grad():
        logits = model.run(torch.tensor([x + y])).logits[0]
    matcher = Constraint(config, tok, tok.vocab_size, reply_stops(config, tok))
    assert len(view["steps"]) == len(y) + 1 and view["rejected_at"] is None
    for t, step in enumerate(view["steps"][:-1]):
        mask = matcher.allowed().clone()
        z = logits[len(x) + t - 1]
        p = torch.softmax(z, -1)
        q = torch.softmax(z.masked_fill(~mask, float("-inf")), -1)
        assert step["allowed"] == int(mask.sum())
        assert step["allowed_mass"] == pytest.approx(float(p[mask].sum()), rel=1e-4)
        assert [e["id"] for e in step["top_allowed"]] == q.topk(min(5, int(mask.sum()))).indices.tolist()
        assert step["token"]["p_masked"] == pytest.approx(float(q[y[t]]), rel=1e-4)
        assert step["forced"] is (int(mask.sum()) == 1)
        matcher.consume(y[t])
    assert view["steps"][-1]["complete"] is True  # the object is closed: nothing may follow
    assert view["summary"]["forced"] > 0  # the keys are written by the schema, not the model


def test_a_generated_reply_is_greedy_among_the_allowed_tokens(client, tok) -> None:
    body = client.post(ROUTE, json={"text": "age:", "regex": "[0-9]{2,4}", "max_new_tokens": 8}).json()
    assert body["generated"] is True and body["finish_reason"] in ("stop", "length")
    text = "".join(t["token"] for t in body["tokens"] if t["id"] != tok.eot_id)
    assert re.fullmatch("[0-9]{2,4}", text), text
    for step in body["steps"]:
        if step["token"] is None or step["complete"]:
            continue
        assert step["token"]["allowed"]
        assert step["token"]["id"] == step["top_allowed"][0]["id"]  # greedy: the most probable allowed token
        if step["overruled"]:
            assert step["token"]["id"] != step["model_choice"]["id"]


@pytest.mark.parametrize("seed", range(3))
def test_a_sampled_json_reply_validates_and_every_token_was_allowed(client, seed) -> None:
    schema = SCHEMAS["nested"]
    body = client.post(
        ROUTE,
        json={"text": "give:", "json_schema": schema, "max_new_tokens": 62, "temperature": 1.0, "seed": seed},
    ).json()
    steps = [s for s in body["steps"] if s["token"] is not None and not s["complete"]]
    assert steps and all(s["token"]["allowed"] for s in steps)
    if body["finish_reason"] == "stop":
        text = "".join(t["token"] for t in body["tokens"] if not t["token"].startswith("<|"))
        validate(json.loads(text), schema)


def test_a_given_reply_that_leaves_the_language_stops_where_it_does(client) -> None:
    body = client.post(ROUTE, json={"text": "n:", "regex": "[0-9]+", "completion": "4a2"}).json()
    assert body["rejected_at"] == 1 and len(body["steps"]) == 2
    assert body["steps"][1]["token"]["token"] == "a" and body["steps"][1]["token"]["allowed"] is False


def test_a_vocabulary_that_cannot_start_the_reply_shows_no_allowed_token(model) -> None:
    letters = CharTokenizer.from_text("abcdefgh :")
    small = tiny_model(vocab_size=letters.vocab_size, block_size=32)
    with TestClient(create_app(small, letters, model_name="tiny")) as c:
        r = c.post(ROUTE, json={"text": "a:", "regex": "[0-9]+"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokens"] == [] and body["finish_reason"] == "no_token"
        assert body["steps"][0]["allowed"] == 0 and "allows no token" in body["steps"][0]["note"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"regex": "[0-9"}, "regex", "could not be compiled"),
        ({"regex": "(?=a)b"}, "regex", "look-around"),
        ({"json_schema": {"type": 0}}, "json_schema", "type must be"),
        ({"json_schema": {"properties": 3}}, "json_schema", "properties"),
        ({"json_schema": {"type": "object"}, "regex": "[0-9]"}, "regex", "exactly one"),
        ({}, "json_schema", "exactly one"),
        ({"regex": ""}, "regex", ""),
        ({"regex": "[0-9]", "top": 0}, "top", ""),
        ({"regex": "[0-9]", "max_new_tokens": 0}, "max_new_tokens", ""),
    ],
)
def test_what_cannot_be_taken_is_a_400_naming_the_field(client, body, param, words) -> None:
    r = client.post(ROUTE, json={"text": "n:", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert words in error["message"]
    assert client.post(ROUTE, json={"text": "n:", "regex": "[0-9]", "completion": "1"}).status_code == 200


def test_the_python_api_takes_a_lark_grammar_and_refuses_two_constraints(model, tok) -> None:
    view = grammar_steps(model, tok, "say:", "yes", constraint_config(grammar='start: "yes" | "no"'))
    assert [s["allowed"] for s in view["steps"][:3]] == [2, 1, 1]  # "y" or "n", then the word is forced
    assert view["steps"][1]["forced"] and view["steps"][-1]["complete"]
    with pytest.raises(GptlabError, match="exactly one"):
        constraint_config(json_schema={}, regex="a")


def test_the_route_is_in_the_openapi_schema(client) -> None:
    schema = client.get("/openapi.json").json()
    op = schema["paths"][ROUTE]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
    fields = schema["components"]["schemas"][ref]
    assert {"json_schema", "regex", "completion", "top", "max_new_tokens"} <= set(fields["properties"])
    assert fields["properties"]["regex"]["anyOf"][0]["format"] == "regex"
    assert "400" in op["responses"] and "allOf" in fields


def test_a_reply_given_as_the_ids_the_playground_drew_walks_those_tokens(client, tok) -> None:
    events = client.post(
        "/v1/gptlab/generate",
        json={"prompt": "give:", "max_tokens": 40, "seed": 3, "response_format": {
            "type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMAS["array"]}}},
    ).text  # fmt: skip
    drawn = [json.loads(line[6:])["id"] for line in events.splitlines() if '"type": "token"' in line]
    assert drawn
    body = client.post(
        ROUTE, json={"text": "give:", "json_schema": SCHEMAS["array"], "completion": drawn}
    ).json()
    assert [t["id"] for t in body["tokens"]] == drawn and body["rejected_at"] is None
    assert all(s["token"]["allowed"] for s in body["steps"] if s["token"] is not None)
    for step, t in zip(body["steps"], drawn, strict=False):
        assert step["token"]["id"] == t
    r = client.post(ROUTE, json={"text": "n:", "regex": "[0-9]+", "completion": [tok.vocab_size]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "completion"
    spec = client.get("/openapi.json").json()["components"]["schemas"]["InsideGrammarRequest"]
    ids = [a for a in spec["properties"]["completion"]["anyOf"] if a.get("type") == "array"][0]
    assert ids["items"]["maximum"] == tok.vocab_size - 1


def test_a_token_the_engine_masks_in_but_its_parser_refuses_is_shown_refused(client, tok) -> None:
    """Schemathesis found it: a regex whose first character no token has, and a given reply. Whatever
    the engine's mask says at step 0 (it let most tokens through), the walk stops at the refused token."""
    regex = json.loads('"^\\u009b{2,4}\\\\w{0}.+?\\\\d??\\udaf3\\udc29{1}$"')
    r = client.post(ROUTE, json={"text": ":", "regex": regex, "completion": tok.encode("y")})
    assert r.status_code == 200, r.text
    step = r.json()["steps"][0]
    assert r.json()["rejected_at"] == 0 and step["token"]["allowed"] is False
    assert "<state>" not in step.get("note", "")


def test_a_masked_language_encoder_does_not_offer_the_route() -> None:
    """An encoder writes no reply: its server answers the route as every generating one, out of its schema."""
    tok = CharTokenizer.from_text("abcdefgh :", special_tokens=["[MASK]"])
    encoder = tiny_model(vocab_size=tok.vocab_size, block_size=32, arch="encoder", causal=False)
    with TestClient(create_app(encoder, tok, model_name="mlm")) as c:
        r = c.post(ROUTE, json={"text": "ab", "regex": "[a-c]+"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_cannot_generate"
        assert ROUTE not in c.get("/openapi.json").json()["paths"]
