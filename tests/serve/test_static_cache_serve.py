"""The server's scheduler decodes through the static lane where it can, with the same tokens.

On the CPU the static lane is asked for with ``prepare_decoding(model, static=True, compile="off")`` (on CUDA it is
there by default): the same step function a CUDA graph captures, run eagerly.
"""

from __future__ import annotations

import threading

import torch
from fastapi.testclient import TestClient

from gptlab import GPT
from gptlab.serve import create_app
from gptlab.serve.lanes import Lanes
from gptlab.tokenizers import CharTokenizer
from tests._tiny import tiny_model
from tests.generate._static import eager_static


def tiny(vocab: int, seed: int = 0) -> GPT:
    return tiny_model(seed=seed, vocab_size=vocab, n_head=2, pos="rope")


def completions(model: GPT, tok: CharTokenizer, bodies: list[dict]) -> tuple[list[str], Lanes]:
    """Send ``bodies`` concurrently to a fresh app → the texts, and the scheduler's session."""
    app = create_app(model, tok, model_name="tiny", max_batch=4, max_tokens_cap=64, max_body_bytes=4096)
    out: list[str] = [""] * len(bodies)
    with TestClient(app) as client:

        def call(i: int) -> None:
            r = client.post("/v1/completions", json=bodies[i])
            assert r.status_code == 200, r.text
            out[i] = r.json()["choices"][0]["text"]

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        session = app.state.scheduler.session
    return out, session


def test_the_static_lane_serves_the_same_tokens(char_tok):
    bodies = [
        {"prompt": "to be or", "max_tokens": 40, "temperature": 0},  # slides past the 32-token context
        {"prompt": "ROMEO:", "max_tokens": 12, "temperature": 0},
        {"prompt": "xyz", "max_tokens": 12, "temperature": 0.8, "top_k": 5, "seed": 4},
        {"prompt": "hello", "max_tokens": 12, "temperature": 0, "frequency_penalty": 0.5},  # in the graph
        {"prompt": "a", "max_tokens": 9, "temperature": 0},
        {"prompt": "q", "max_tokens": 12, "temperature": 0, "logprobs": 2},  # dynamic lane
    ]
    reference, plain = completions(tiny(char_tok.vocab_size), char_tok, bodies)
    assert plain.static is None  # on a CPU, unasked: the dynamic lane only
    model = eager_static(tiny(char_tok.vocab_size))
    got, lanes = completions(model, char_tok, bodies)
    assert lanes.static is not None and lanes.static.captures > 0  # the static lane really decoded
    for i in (0, 1, 3, 4, 5):  # greedy: the same text on either lane
        assert got[i] == reference[i], bodies[i]
    assert len(got[2]) == 12  # sampled in the graph (its own numbers), the full length
    again, _ = completions(eager_static(tiny(char_tok.vocab_size)), char_tok, bodies[2:3])
    assert again[0] == got[2]  # a seed reproduces a sampled request whatever ran beside it


def test_the_static_lane_never_samples_past_the_tokenizers_vocabulary(char_tok):
    """A model whose table is larger than its tokenizer (a padded or a generic-shape model): the
    lane samples only the tokenizer's ids, as the dynamic path does (an id beyond it once ended
    every stream in a server error)."""
    model = eager_static(tiny(char_tok.vocab_size + 40, seed=3))
    with torch.no_grad():  # make the ids the tokenizer lacks the likeliest ones
        model.lm_head.weight[char_tok.vocab_size :] *= 50.0
    bodies = [{"prompt": "ab", "max_tokens": 10, "temperature": t, "seed": 1} for t in (0, 1.0)]
    texts, session = completions(model, char_tok, bodies)
    assert session.static is not None and session.static.vocab == char_tok.vocab_size
    assert all(len(t) == 10 for t in texts)  # ten characters each: every id decoded
