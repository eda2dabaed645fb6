"""What lm-eval's ``local-completions`` asks of ``/v1/completions``: echo with logprobs (the prompt's own
log-probabilities, then the completion's), ``max_tokens: 0``, the stop token reported, and the tokenizer
routes (``/tokenizer_info``, ``/tokenize``, ``/detokenize``)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gptlab.serve import create_app
from tests.serve._serving import EOT, assert_error, raw_logprobs


@pytest.mark.parametrize("max_tokens", [0, 1, 3])
def test_echo_with_logprobs_scores_the_prompt(client, model, tok, max_tokens):
    ids = tok.encode("to be or not")
    body = {"prompt": [ids], "max_tokens": max_tokens, "logprobs": 2, "echo": True, "temperature": 0}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    lp = choice["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == n + max_tokens
    assert lp["tokens"][:n] == [tok.decode([i]) for i in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    logp = raw_logprobs(model, ids)
    expected = [float(logp[t - 1, ids[t]]) for t in range(1, n)]
    assert lp["token_logprobs"][1:n] == pytest.approx(expected, abs=1e-5)
    for t in range(1, n):  # the 2 most probable tokens at each position, with their log p
        best = logp[t - 1].topk(2)
        assert lp["top_logprobs"][t] == pytest.approx(
            {tok.decode([i]): v for i, v in zip(best.indices.tolist(), best.values.tolist(), strict=True)},
            abs=1e-5,
        )
    assert lp["text_offset"] == [sum(len(x) for x in lp["tokens"][:i]) for i in range(n + max_tokens)]
    assert choice["text"].startswith("to be or not")
    if max_tokens:  # the first generated token: greedy, from the distribution after the whole prompt
        assert lp["token_logprobs"][n] == pytest.approx(float(raw_logprobs(model, ids)[-1].max()), abs=1e-5)


def test_lm_evals_loglikelihood_request(client, model, tok):
    """lm-eval's request: token ids of context ⧺ continuation, max_tokens 1; it sums [ctxlen:-1]."""
    ctx, cont = tok.encode("the cat"), tok.encode(" sat")
    body = {
        "prompt": [ctx + cont],
        "max_tokens": 1,
        "logprobs": 1,
        "echo": True,
        "temperature": 0,
        "seed": 1234,
    }
    lp = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    logp = raw_logprobs(model, ctx + cont)
    expected = sum(float(logp[len(ctx) - 1 + t, cont[t]]) for t in range(len(cont)))
    assert sum(lp["token_logprobs"][len(ctx) : -1]) == pytest.approx(expected, abs=1e-5)


def test_a_stop_token_is_reported(client, model, tok):
    """A prompt whose greedy next token is <|endoftext|>: logprobs has it, as usage counts it."""
    eot = tok.encode(EOT, allowed_special="all")[0]
    prompt = tok.encode("hello")
    body = {
        "prompt": [prompt],
        "max_tokens": 1,
        "logprobs": 5,
        "temperature": 0,
        "logit_bias": {str(eot): 100},
    }
    reply = client.post("/v1/completions", json=body).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == ""
    assert choice["logprobs"]["tokens"] == [EOT]
    assert len(choice["logprobs"]["token_logprobs"]) == reply["usage"]["completion_tokens"] == 1
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "logprobs": True,
        "temperature": 0,
    }
    content = client.post("/v1/chat/completions", json={**chat, "logit_bias": {str(eot): 100}}).json()
    assert content["choices"][0]["logprobs"]["content"] == []  # chat never reports the end-of-turn token


def test_max_tokens_zero_without_echo_is_empty(client, tok):
    reply = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 0, "logprobs": 1}).json()
    assert reply["choices"][0]["text"] == "" and reply["usage"]["completion_tokens"] == 0


def test_tokenizer_routes(client, tok):
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == EOT and info["model_max_length"] == 64
    ids = client.post("/tokenize", json={"prompt": "ab" + EOT, "add_special_tokens": False}).json()["tokens"]
    assert ids == tok.encode("ab" + EOT, allowed_special="all")
    assert client.post("/detokenize", json={"tokens": ids}).json()["prompt"] == "ab" + EOT
    assert_error(client.post("/detokenize", json={"tokens": [10_000]}), 400, "tokens")
    assert_error(client.post("/tokenize", json={"prompt": 5}), 400, "prompt")


def test_tokenizer_routes_need_the_key(model, tok):
    with TestClient(create_app(model, tok, api_key="sesame")) as c:
        assert c.get("/tokenizer_info").status_code == 401
        ok = c.post("/tokenize", json={"prompt": "ab"}, headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200 and ok.json()["count"] == 2


def test_echo_scores_a_prompt_that_fills_the_context(client, model, tok):
    """A prompt of the whole context with max_tokens 1 is scored whole (the generation slides on)."""
    ids = (tok.encode("the quick brown fox jumps over the lazy dog ") * 3)[:64]
    body = {"prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
    lp = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    logp = raw_logprobs(model, ids)
    assert len(lp["tokens"]) == 65
    assert lp["token_logprobs"][1:64] == pytest.approx(
        [float(logp[t - 1, ids[t]]) for t in range(1, 64)], abs=1e-5
    )
    too_long = client.post("/v1/completions", json={**body, "prompt": [ids + ids[:1]]})
    assert_error(too_long, 400, "prompt")
