"""One request cannot harm another (issue #33).

Numbers that once made NaN, overflow or a division by zero in the shared loop are refused
with a 400 naming the field, and the sampler and beam search take them anyway without
failing; a job whose own step raises ends alone; a client that hangs up (streaming or not,
sampling or beam search, with an API key) leaves nothing running. The live scenarios are
``bench/serve_robustness.py``'s, with fewer repetitions.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from bench import serve_robustness as robustness
from gptlab import GPT
from gptlab.generate import SampleConfig
from gptlab.generate.beam import beam_search
from gptlab.generate.request import RequestState
from gptlab.generate.sampling import Sampler
from gptlab.serve import create_app, scheduler
from gptlab.serve.jobs import Channel, EndEvent, Job
from gptlab.tokenizers import CharTokenizer

AUTH = robustness.AUTH


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(robustness.TEXT)


@pytest.fixture(scope="module")
def model(tok, tiny_model) -> GPT:
    return tiny_model(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)


@pytest.fixture(scope="module")
def client(model, tok):
    app = create_app(model, tok, model_name="tiny", max_batch=4, max_tokens_cap=16, api_key=robustness.KEY)
    with TestClient(app, headers=AUTH) as c:
        yield c


def error_of(response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


# ------------------------------------------------------------------ bounds, stated and checked
@pytest.mark.parametrize(("name", "body"), robustness.BAD_NUMBERS)
def test_the_issues_bad_numbers_are_400_naming_the_field(client, name, body):
    err = error_of(client.post("/v1/completions", json={**body, "max_tokens": 2}))
    assert err["param"] == name.split()[0]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 1.5}, "n"),
        ({"temperature": 101}, "temperature"),
        ({"top_k": 2**40}, "top_k"),
        ({"repetition_penalty": 1e3}, "repetition_penalty"),
        ({"logit_bias": {"²": 1}}, "logit_bias"),  # a digit to str.isdigit, not to int()
        ({"stop": [""]}, "stop"),
        ({"prompt": []}, "prompt"),
    ],
)
def test_out_of_bounds_fields_are_400(client, body, param):
    err = error_of(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, **body}))
    assert err["param"].startswith(param)


def test_nan_and_infinity_literals_are_400(client):
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        raw = b'{"prompt": "a", "max_tokens": 2, "length_penalty": ' + literal + b"}"
        response = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert error_of(response)["param"] == "length_penalty"


def test_whole_floats_are_integers(client):
    r = client.post("/v1/completions", json={"prompt": "a", "n": 2.0, "max_tokens": 3.0, "temperature": 0})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2


def test_a_405_says_which_methods_are_allowed(client):
    for method, path in (("TRACE", "/v1/models"), ("POST", "/v1/models"), ("GET", "/v1/completions")):
        r = client.request(method, path)
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert r.headers["allow"] in ("GET", "POST")


# ------------------------------------------------------------------ the sampler and beam search take them anyway
def test_the_sampler_never_fails_on_extreme_numbers():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0)) * 10
    history = list(range(50))  # every token seen: the penalties touch every logit
    for options in (
        {"temperature": 1e-320},
        {"temperature": 1e-40},
        {"top_p": 1e-300},
        {"repetition_penalty": 1e-40},
        {"repetition_penalty": 1e40},
        {"seed": 2**70},
        {"seed": -(2**70)},
    ):
        sampler = Sampler(SampleConfig(**options), 50)
        token = sampler(logits, history)
        assert 0 <= token < 50, options
    best = int(torch.argmax(logits))
    assert Sampler(SampleConfig(temperature=1e-320), 50)(logits, []) == best  # τ → 0 is greedy
    assert Sampler(SampleConfig(top_p=1e-300, seed=3), 50)(logits, []) == best  # the nucleus keeps the top
    sampler = Sampler(SampleConfig(temperature=0.8, seed=1), 50)  # no draw possible: the argmax, no error
    assert sampler.choose(torch.full((50,), float("-inf"))) == 0
    assert sampler.choose(torch.full((50,), float("nan"))) == 0
    spike = torch.full((50,), float("-inf"))
    spike[7] = 0.0
    assert sampler.choose(spike) == 7  # one finite logit: always drawn


def test_beam_search_takes_any_length_penalty(model):
    for alpha in (-487.6, 1e5, -1e5):
        tokens, reason = beam_search(
            model, [1, 2, 3], SampleConfig(max_new_tokens=6, beam_width=3, length_penalty=alpha)
        )
        assert reason == "length" and len(tokens) == 6


# ------------------------------------------------------------------ a job that fails, fails alone
class Exploding(RequestState):
    """A per-token step that raises on its third token, for choice 1 only."""

    def advance(self, logits, full=None):
        if self.index == 1 and self.sampled == 2:
            raise RuntimeError("boom")
        return super().advance(logits, full)


def test_a_job_whose_step_raises_ends_alone(model, tok, monkeypatch):
    monkeypatch.setattr(scheduler, "RequestState", Exploding)

    async def scenario() -> dict[int, EndEvent]:
        sched = scheduler.Scheduler(model, tok, max_batch=4)
        loop = asyncio.get_running_loop()
        jobs = [
            Job(tok.encode("ab"), SampleConfig(max_new_tokens=12), Channel(loop), index=i) for i in range(3)
        ]
        for job in jobs:
            sched.submit(job)
        ends: dict[int, EndEvent] = {}
        for job in jobs:
            while job.index not in ends:
                for event in await asyncio.wait_for(job.channel.get(), 30):
                    if isinstance(event, EndEvent):
                        ends[event.index] = event
        assert sched.stats()["active"] == 0
        sched.close()
        return ends

    ends = asyncio.run(scenario())
    assert ends[1].finish_reason == "error" and ends[1].status == 500 and "boom" in ends[1].error
    assert ends[1].completion_tokens == 2
    for i in (0, 2):
        assert ends[i].error is None and ends[i].finish_reason == "length" and ends[i].completion_tokens == 12


# ------------------------------------------------------------------ live, with an API key
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = robustness.tiny_checkpoint(tmp_path_factory.mktemp("isolation"))
    extra = ["--api-key", robustness.KEY, "--device", "cpu"]
    with robustness.serve_load.serve(str(ckpt), max_batch=8, extra=extra, timeout=120) as url:
        yield url


def test_bad_numbers_fail_alone_beside_three_victims(server):
    results = asyncio.run(robustness.bad_numbers(server))
    assert len(results) == 7
    for r in results:
        assert 400 <= r["status"] < 500 and r["victims"] == [200, 200, 200], r


def test_streaming_chats_that_hang_up_leave_nothing_running(server):
    result = asyncio.run(robustness.hangups(server, 8))
    assert result["active"] == 0 and result["waiting"] == 0, result
    assert result["next_status"] == 200


def test_a_playground_stream_that_hangs_up_is_cancelled(server):
    async def scenario() -> tuple[dict, int]:
        async with httpx.AsyncClient(timeout=60, headers=AUTH) as c:
            before = (await robustness.health(c, server))["tokens"]
            body = {"prompt": "ab", "max_tokens": 1000}
            await robustness.hangup(c, server, "/v1/gptlab/generate", body)
            h = await robustness.settled(c, server, timeout=30)
            return h, h["tokens"] - before

    h, tokens = asyncio.run(scenario())
    assert h["active"] == 0 and h["waiting"] == 0, h
    assert tokens < 1000  # stopped, not run to max_tokens


@pytest.mark.slow
def test_thirty_hangups_leave_nothing_running(server):
    result = asyncio.run(robustness.hangups(server, 30))
    assert result["active"] == 0 and result["waiting"] == 0, result
    assert result["next_status"] == 200


def test_a_beam_request_whose_client_leaves_is_cancelled(server):
    result = asyncio.run(robustness.beam_hangup(server))
    assert result["active"] == 0 and result["waiting"] == 0, result
    assert result["cleared_s"] < 5 and result["next_status"] == 200, result


def test_a_non_streaming_request_whose_client_leaves_is_cancelled(server):
    async def scenario() -> dict:
        async with httpx.AsyncClient(timeout=60, headers=AUTH) as c:
            await robustness.abandon(c, server, {"prompt": "ab", "n": 16, "max_tokens": 1000})
            return await robustness.settled(c, server, timeout=10)

    h = asyncio.run(scenario())
    assert h["active"] == 0 and h["waiting"] == 0, h


def test_a_body_without_content_type_is_json_and_a_form_is_400(client):
    raw = b'{"prompt": "ab", "max_tokens": 2}'
    assert client.post("/v1/completions", content=raw).status_code == 200
    form = {"content-type": "application/x-www-form-urlencoded"}  # curl -d without -H
    err = error_of(client.post("/v1/completions", content=raw, headers=form))
    assert err["code"] == "invalid_json" and "application/json" in err["message"]
