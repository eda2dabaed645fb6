"""Schema-driven fuzzing: Schemathesis generates requests from the served ``/openapi.json``
(valid ones and ones that break it) and checks every answer against the same schema.

``st run URL/openapi.json --checks all`` runs against a live ``gptlab serve`` with an API key,
on a tiny random character model whose tokenizer has no unknown-character token, so the
schema's limits (the alphabet, the cap on ``max_tokens``, token ids below the vocabulary) are
exercised too. Every check is on: no 5xx, only documented status codes, content types and
bodies (each server-sent event too), valid data accepted, invalid data refused, a 401 without
the key, 405 with ``Allow`` for methods the schema lacks.

The fast test runs the examples and fuzzing phases with a fixed seed; the slow one adds the
coverage and stateful phases and draws fresh examples each run. The command, with more cases,
is in docs/guide/serving-robustness.md.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bench import serve_robustness as robustness
from tests._tiny import tiny_model
from tests.serve._fuzz import KEY, fuzz


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A live ``gptlab serve`` with an API key; yields its URL."""
    ckpt = robustness.tiny_checkpoint(tmp_path_factory.mktemp("fuzz"))
    extra = ["--api-key", KEY, "--device", "cpu", "--max-tokens-cap", "16", "--model-name", "tiny"]
    extra += ["--cors", "https://chat.example.org"]
    with robustness.serve_load.serve(str(ckpt), max_batch=4, extra=extra, timeout=120) as url:
        yield url


@pytest.fixture(scope="module")
def app():

    from gptlab.serve import create_app
    from gptlab.tokenizers import CharTokenizer

    tok = CharTokenizer.from_text(robustness.TEXT)
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)
    app = create_app(model, tok, model_name="tiny", max_batch=4, max_tokens_cap=8, api_key=KEY)
    with TestClient(app):  # runs the lifespan: the scheduler stops at the end of the module
        yield app


def test_the_schema_declares_every_body_status_and_stream(app):
    with TestClient(app) as c:
        spec = c.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/gptlab/generate", "/v1/gptlab/attention"):
        op = spec["paths"][path]["post"]
        assert op["requestBody"]["required"] is True
        assert set(op["responses"]) == {"200", "400", "401", "404", "413", "500"}
        assert "422" not in op["responses"]
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["max_tokens"]["anyOf"][0]["maximum"] == 8  # this server's cap
    assert "text/event-stream" in spec["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert set(spec["paths"]["/v1/gptlab/generate"]["post"]["responses"]["200"]["content"]) == {
        "text/event-stream"
    }


def test_the_command_line_s_cors_origin_is_the_one_served(server):
    """``gptlab serve --cors ORIGIN``: that page may call the API, and no longer those of this machine."""
    import httpx

    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    named = httpx.options(f"{server}/v1/completions", headers={"Origin": "https://chat.example.org", **ask})
    assert (
        named.status_code == 200
        and named.headers["access-control-allow-origin"] == "https://chat.example.org"
    )
    local = httpx.options(f"{server}/v1/completions", headers={"Origin": "http://localhost:3000", **ask})
    assert local.status_code == 400 and "access-control-allow-origin" not in local.headers


def test_fuzz_fast(server, tmp_path):
    generated, out = fuzz(server, tmp_path, "--phases", "examples,fuzzing", "-n", "8", "--seed", "1")
    assert generated >= 50 and "No issues found" in out


@pytest.mark.slow
def test_fuzz_slow(server, tmp_path):
    generated, out = fuzz(server, tmp_path, "-n", "60")
    assert generated >= 1000 and "No issues found" in out
