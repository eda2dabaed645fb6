"""The serving KV cache is sized to the requests: it starts small, doubles as rows need, shrinks when idle."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from gptlab.generate import BatchSession
from gptlab.model import GPT
from gptlab.serve import create_app
from gptlab.serve.scheduler import KV_START_TOKENS
from gptlab.tokenizers.char import CharTokenizer
from tests._tiny import tiny_model


def tiny(block_size: int = 64, pos: str = "rope") -> GPT:
    return tiny_model(vocab_size=40, block_size=block_size, n_kv_head=2, pos=pos)


def uncached(model: GPT, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0, -1]


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_growing_cache_equals_the_uncached_model_across_every_growth(pos):
    model = tiny(block_size=40, pos=pos)
    session = BatchSession(model, 2, capacity=4)
    assert session.capacity == 4 and session.stores[0].k.shape[2] == 4
    ids = torch.randint(0, 40, (2, 60), generator=torch.Generator().manual_seed(1)).tolist()
    (a, la), (b, lb) = session.add(ids[0][:3]), session.add(ids[1][:6])  # the second prompt grows it to 8
    assert session.capacity == 8
    torch.testing.assert_close(la, uncached(model, ids[0][:3]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lb, uncached(model, ids[1][:6]), atol=1e-5, rtol=1e-5)
    n = {a: 3, b: 6}
    seen = {session.capacity}
    while n[b] < 39:  # up to the context: 8 → 16 → 32 → 40 (capped at max_len)
        out = session.step({a: ids[0][n[a]], b: ids[1][n[b]]})
        n[a], n[b] = n[a] + 1, n[b] + 1
        seen.add(session.capacity)
        torch.testing.assert_close(out[a], uncached(model, ids[0][: n[a]]), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out[b], uncached(model, ids[1][: n[b]]), atol=1e-4, rtol=1e-4)
    assert seen == {8, 16, 32, 40}
    session.remove(a)
    assert session.capacity == 40  # slot b still needs it
    session.remove(b)
    assert session.capacity == 4  # idle: back to the starting size


def test_default_session_allocates_the_whole_context_at_once():
    session = BatchSession(tiny(block_size=48), 2)
    assert session.capacity == 48 and session.stores[0].k.shape[2] == 48


def test_a_short_request_does_not_allocate_the_models_context():
    tok = CharTokenizer.from_text("abcdefghij klmnopqrstuvwxyz")
    model = tiny(block_size=16 * KV_START_TOKENS)
    app = create_app(model, tok, model_name="tiny", max_batch=4)
    with TestClient(app) as c:
        scheduler = app.state.scheduler
        cfg = model.config  # 2·L·B·H_kv·T·d_k float32 numbers at the whole context
        full = 2 * cfg.n_layer * 4 * cfg.n_kv_head * cfg.block_size * cfg.head_dim * 4
        assert scheduler.session.dynamic.capacity == KV_START_TOKENS
        r = c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5, "temperature": 0})
        assert r.status_code == 200, r.text
        held = sum(s.nbytes() for s in scheduler.session.dynamic.stores)
        assert held <= full * KV_START_TOKENS // model.config.block_size < full
        # a request longer than the starting size grows the cache (it would fail otherwise), then
        # the idle server gives the memory back
        n = 5 * KV_START_TOKENS
        r = c.post("/v1/completions", json={"prompt": "ab" * (n // 2), "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == n
        assert scheduler.session.dynamic.capacity == KV_START_TOKENS
