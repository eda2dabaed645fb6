"""A server started before its one-row step was kept takes the step up once the compile cache keeps it
(``Lanes.adopt_kept_step``): ``--compile auto`` decodes layer by layer and compiles the step in a
background process for later ones; when that process has kept it, the next requests that decode
alone run it, with the same greedy text, and ``/health`` says how the batch decodes now."""

from __future__ import annotations

from fastapi.testclient import TestClient

from gptlab.generate import prepare_decoding
from gptlab.serve import create_app
from gptlab.tokenizers import CharTokenizer
from tests._kept import keep_a_recording_step
from tests._tiny import ALPHABET, tiny_model


def test_a_running_server_takes_up_a_step_kept_after_it_started(tmp_path, monkeypatch):
    monkeypatch.setattr("gptlab.generate.plan.STREAM_MIN_BYTES", 0)  # as if the model were large
    monkeypatch.setattr("gptlab.generate.plan.compile_blocker", lambda device: None)
    monkeypatch.setattr("gptlab.serve.lanes.RECHECK_S", 0.0)
    tok = CharTokenizer.from_text(ALPHABET, special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32, pos="rope", norm="rmsnorm")
    prepare_decoding(model, compile="auto", compile_cache=tmp_path)
    body = {"prompt": "abc", "max_tokens": 8, "temperature": 0}
    with TestClient(create_app(model, tok, model_name="tiny", max_batch=2)) as c:
        before = c.get("/health").json()["decode_plan"]
        assert "layer by layer" in before and "lone row" not in before
        first = c.post("/v1/completions", json=body)
        assert first.status_code == 200, first.text
        calls = keep_a_recording_step(model, tmp_path)  # a background `gptlab compile` has kept it
        second = c.post("/v1/completions", json=body)
        assert second.status_code == 200, second.text
        assert second.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
        assert calls and set(calls) == {1}  # the request, decoded alone, ran the one-row step
        assert "(a lone row: one compiled graph per token" in c.get("/health").json()["decode_plan"]


def test_lanes_ask_the_compile_cache_again_at_most_every_recheck_interval(tmp_path, monkeypatch):
    """Admitting requests asks the plan again only once ``RECHECK_S`` seconds have passed (a busy server
    does not stat the cache per request); lanes that have the step never ask again."""
    from gptlab.serve.lanes import RECHECK_S, Lanes

    monkeypatch.setattr("gptlab.generate.plan.STREAM_MIN_BYTES", 0)
    monkeypatch.setattr("gptlab.generate.plan.compile_blocker", lambda device: None)
    model = tiny_model(vocab_size=40, n_layer=2, n_head=4, n_embd=32, pos="rope", norm="rmsnorm")
    prepare_decoding(model, compile="auto", compile_cache=tmp_path)
    lanes = Lanes(model, 2)
    start = lanes._checked
    assert not lanes.adopt_kept_step(start + 2 * RECHECK_S)  # nothing kept yet
    keep_a_recording_step(model, tmp_path)
    assert not lanes.adopt_kept_step(start + 2.5 * RECHECK_S)  # asked too recently
    assert lanes.adopt_kept_step(start + 3 * RECHECK_S) and lanes.dynamic.one_token is not None
    assert not lanes.adopt_kept_step(start + 10 * RECHECK_S)  # it has the step
