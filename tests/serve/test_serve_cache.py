"""The serving KV cache is sized to the requests: it starts small, doubles as rows need, and is kept for
an idle grace period (``kv_keep_s``) before it shrinks back, so the next request does not allocate it again."""

from __future__ import annotations

import time

import pytest
import torch
from fastapi.testclient import TestClient

from gptlab.errors import GptlabError
from gptlab.generate import BatchSession
from gptlab.model import GPT
from gptlab.serve import create_app
from gptlab.serve.scheduler import KV_START_TOKENS, Scheduler
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


def test_a_session_that_does_not_shrink_when_idle_keeps_its_growth_until_shrink():
    model = tiny(block_size=40)
    session = BatchSession(model, 2, capacity=4)
    session.shrink_when_idle = False
    a, _ = session.add([1, 2, 3, 4, 5, 6])  # grows to 8
    b, _ = session.add([1, 2])
    session.remove(a)
    assert session.grown and not session.shrink()  # slot b is in use: nothing to give back yet
    session.remove(b)
    assert session.capacity == 8 and session.grown  # idle, still grown
    _, again = session.add([1, 2, 3, 4, 5, 6])
    torch.testing.assert_close(again, uncached(model, [1, 2, 3, 4, 5, 6]), atol=1e-5, rtol=1e-5)
    session.remove(0)
    assert session.shrink() and session.capacity == 4 and not session.grown
    assert not session.shrink()  # already at the starting size


def test_default_session_allocates_the_whole_context_at_once():
    session = BatchSession(tiny(block_size=48), 2)
    assert session.capacity == 48 and session.stores[0].k.shape[2] == 48


def kv_bytes(scheduler: Scheduler) -> int:
    return sum(s.nbytes() for s in scheduler.session.dynamic.stores)


def wait_for(cond, timeout: float = 5.0) -> bool:
    """Poll ``cond()`` every 20 ms until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def long_request(c: TestClient, n: int) -> None:
    r = c.post("/v1/completions", json={"prompt": "ab" * (n // 2), "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == n


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
        assert kv_bytes(scheduler) <= full * KV_START_TOKENS // model.config.block_size < full
        assert c.get("/health").json()["kv_capacity"] == KV_START_TOKENS


def test_the_grown_cache_is_kept_through_the_grace_period_and_reused():
    """Within ``kv_keep_s`` idle seconds the grown cache stays (the same memory, not re-allocated) and
    the next long request runs in it; the cache never exceeds the grown size."""
    tok = CharTokenizer.from_text("abcdefghij klmnopqrstuvwxyz")
    model = tiny(block_size=16 * KV_START_TOKENS)
    app = create_app(model, tok, model_name="tiny", max_batch=4, kv_keep_s=600)
    with TestClient(app) as c:
        scheduler = app.state.scheduler
        small = kv_bytes(scheduler)
        n = 5 * KV_START_TOKENS  # grows the cache (it would fail otherwise) to 8 · KV_START_TOKENS
        long_request(c, n)
        grown = scheduler.session.dynamic.stores[0].k
        assert grown.size(2) == 8 * KV_START_TOKENS and kv_bytes(scheduler) == 8 * small
        health = c.get("/health").json()  # idle now, within the grace period
        assert health["active"] == 0 and health["kv_capacity"] == 8 * KV_START_TOKENS
        long_request(c, n - 2)
        assert scheduler.session.dynamic.stores[0].k is grown  # the same tensor: nothing re-allocated
        r = c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and scheduler.session.dynamic.stores[0].k is grown


@pytest.mark.parametrize("keep_s", [0.0, 0.3])
def test_the_idle_server_gives_the_memory_back_after_the_grace_period(keep_s):
    tok = CharTokenizer.from_text("abcdefghij klmnopqrstuvwxyz")
    model = tiny(block_size=16 * KV_START_TOKENS)
    app = create_app(model, tok, model_name="tiny", max_batch=4, kv_keep_s=keep_s)
    with TestClient(app) as c:
        scheduler = app.state.scheduler
        small = kv_bytes(scheduler)
        t0 = time.monotonic()
        long_request(c, 5 * KV_START_TOKENS)
        assert wait_for(lambda: c.get("/health").json()["kv_capacity"] == KV_START_TOKENS)
        assert time.monotonic() - t0 >= keep_s  # not before the grace period
        assert kv_bytes(scheduler) == small
        # and it grows again for the next long request, then gives the memory back again
        long_request(c, 3 * KV_START_TOKENS)
        assert wait_for(lambda: scheduler.session.dynamic.capacity == KV_START_TOKENS)


def test_the_grace_period_restarts_while_requests_keep_coming():
    """A request inside the grace period keeps the cache: the idle time is counted from the last one."""
    tok = CharTokenizer.from_text("abcdefghij klmnopqrstuvwxyz")
    model = tiny(block_size=16 * KV_START_TOKENS)
    app = create_app(model, tok, model_name="tiny", max_batch=4, kv_keep_s=1.0)
    with TestClient(app) as c:
        scheduler = app.state.scheduler
        long_request(c, 5 * KV_START_TOKENS)
        grown = scheduler.session.dynamic.stores[0].k
        time.sleep(0.4)
        assert scheduler.session.dynamic.stores[0].k is grown  # still within the grace period
        sent = time.monotonic()
        r = c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200
        assert wait_for(lambda: scheduler.session.dynamic.capacity == KV_START_TOKENS)
        assert time.monotonic() - sent >= 1.0  # counted from the short request, not the long one
        assert scheduler.session.dynamic.stores[0].k is not grown


@pytest.mark.parametrize("keep_s", [-1.0, float("nan")])
def test_a_negative_grace_period_is_refused(keep_s):
    with pytest.raises(GptlabError, match="kv_keep_s"):
        Scheduler(tiny(), CharTokenizer.from_text("abc"), kv_keep_s=keep_s)


def test_the_cli_refuses_a_negative_grace_period_before_loading_anything(capsys):
    from gptlab.cli import main

    assert main(["serve", "no-such-checkpoint", "--kv-keep-s", "-1"]) == 2
    assert "--kv-keep-s" in capsys.readouterr().err
