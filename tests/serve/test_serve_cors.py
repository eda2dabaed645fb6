"""Which web pages a browser lets call the server (CORS): by default the pages of this machine, as
ollama's server allows; ``--cors ORIGIN`` others, ``*`` any (llama.cpp's and vLLM's default), ``none``
none. A browser's preflight carries no API key and is answered without one; the answers say which
origin may read them, a 401 included."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gptlab.serve import create_app

KEY = "k"
LOCAL = "http://localhost:3000"
ELSEWHERE = "https://chat.example.org"
BODY = {"prompt": "ab", "max_tokens": 2}


def preflight(c: TestClient, origin: str):
    return c.options(
        "/v1/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
        },
    )


def post(c: TestClient, origin: str, key: str | None = KEY, **extra):
    headers = {"Origin": origin, **({"Authorization": f"Bearer {key}"} if key else {})}
    return c.post("/v1/completions", json={**BODY, **extra}, headers=headers)


@pytest.fixture(scope="module")
def servers(model, tok):
    made = {}
    for name, origins in (("default", None), ("one", [ELSEWHERE]), ("any", ["*"]), ("none", [])):
        app = create_app(model, tok, model_name="tiny", max_batch=2, api_key=KEY, cors_origins=origins)
        made[name] = TestClient(app).__enter__()
    yield made
    for c in made.values():
        c.__exit__(None, None, None)


@pytest.mark.parametrize("origin", [LOCAL, "http://127.0.0.1:8080", "https://[::1]", "http://localhost"])
def test_pages_of_this_machine_may_call_by_default(servers, origin):
    c = servers["default"]
    r = preflight(c, origin)
    assert r.status_code == 200, r.text  # no key needed for the preflight
    assert r.headers["access-control-allow-origin"] == origin
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    answer = post(c, origin)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin
    refused = post(c, origin, key=None)  # the page may read why it was refused
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == origin
    streamed = post(c, origin, stream=True)
    assert streamed.status_code == 200 and streamed.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize("origin", [ELSEWHERE, "http://localhost.evil.example", "http://127.0.0.1.nip.io:80"])
def test_other_pages_may_not_by_default(servers, origin):
    c = servers["default"]
    assert preflight(c, origin).status_code == 400
    r = post(c, origin)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers  # the browser hides it


def test_named_any_and_no_origins(servers):
    one = servers["one"]
    assert preflight(one, ELSEWHERE).headers["access-control-allow-origin"] == ELSEWHERE
    assert preflight(one, LOCAL).status_code == 400  # naming origins replaces the default
    anywhere = servers["any"]
    assert preflight(anywhere, ELSEWHERE).status_code == 200
    assert post(anywhere, ELSEWHERE).headers["access-control-allow-origin"] == "*"
    none = servers["none"]
    assert "access-control-allow-origin" not in post(none, LOCAL).headers
    refused = preflight(none, LOCAL)  # no CORS: an OPTIONS like any request, refused without the key
    assert refused.status_code == 401 and "access-control-allow-origin" not in refused.headers


def test_an_options_request_that_is_no_preflight_is_still_a_405(servers):
    r = servers["default"].options("/v1/completions", headers={"Authorization": f"Bearer {KEY}"})  # no Origin
    assert r.status_code == 405 and r.headers["allow"] == "POST"
