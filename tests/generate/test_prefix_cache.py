"""The prefix cache: a prompt that starts like an earlier sequence copies that prefix's keys and
values and prefills only the rest, with the logits of the uncached model, for every positional
encoding; greedy text is the same with the cache on and off; the budget holds; eviction is LRU."""

from __future__ import annotations

import warnings

import pytest
import torch

from gptlab.errors import GptlabError
from gptlab.generate import BatchSession, ContextWarning, SampleConfig, stream_events
from gptlab.generate.driver import decode_rows, start
from gptlab.generate.prefix_cache import PrefixCache, budget_of
from gptlab.model import GPT
from tests._tiny import tiny_model

POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "none"]
TOL = dict(atol=1e-4, rtol=1e-4)


def tiny(pos: str, block_size: int = 48, **options) -> GPT:
    return tiny_model(block_size=block_size, pos=pos, init_std=0.3, n_kv_head=2, **options)


def uncached(model: GPT, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0, -1]


def ids_of(seed: int, n: int) -> list[int]:
    return torch.randint(0, 61, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("cache_dtype", [None, torch.int8], ids=["float", "int8"])
@pytest.mark.parametrize("pos", POSITIONS)
def test_a_cached_prefix_gives_the_uncached_logits_at_prefill_and_after(pos, cache_dtype):
    model = tiny(pos)
    cache = PrefixCache(1 << 20, block_tokens=4)
    session = BatchSession(model, 3, cache_dtype=cache_dtype, prefix_cache=cache)
    base = ids_of(0, 30)
    slot, _ = session.add(base[:14])
    session.remove(slot)  # leaves 3 blocks (12 tokens)
    # a batch: a longer prompt past the cached blocks, a shorter one inside them, a cold one
    prompts = [base[:21], base[:9], ids_of(1, 7)]
    added = session.add_many(prompts)
    assert cache.hits == 2 and cache.tokens_reused == 12 + 8  # (9 − 1) // 4 blocks for the short one
    tol = TOL if cache_dtype is None else dict(atol=0.15, rtol=0.0)  # int8 keys: the quantised cache's error
    for p, (_, logits) in zip(prompts, added, strict=True):
        torch.testing.assert_close(logits, uncached(model, p), **tol)
    for t in (5, 17, 40):  # decode steps attend over the copied keys too
        out = session.step({s: t for s, _ in added})
        prompts = [p + [t] for p in prompts]
        for p, (s, _) in zip(prompts, added, strict=True):
            torch.testing.assert_close(out[s], uncached(model, p), **tol)


def test_a_session_that_remembers_later_stores_its_prompts_at_remember_prompts():
    """``remember_at_add = False`` (the server's): the prompts' blocks are stored by ``remember_prompts``
    (with the tokens the row has taken since), once; a row removed before it has stored its own already;
    a prompt after that reuses them and gets the uncached logits."""
    model = tiny("rope")
    cache = PrefixCache(1 << 20, block_tokens=4)
    session = BatchSession(model, 2, prefix_cache=cache)
    session.remember_at_add = False
    base = ids_of(2, 30)
    (a, _), (b, _) = session.add_many([base[:10], ids_of(3, 9)])
    assert len(cache) == 0  # nothing stored during the prefill
    session.step({a: base[10], b: 7})
    session.step({a: base[11], b: 7})
    session.remove(b)  # stores its 11 tokens: 2 blocks
    assert len(cache) == 2
    session.remember_prompts()  # a's 12 tokens now: 3 blocks; b is gone (nothing twice)
    assert len(cache) == 5
    session.remember_prompts()  # nothing pending
    assert len(cache) == 5
    slot, logits = session.add(base[:15])
    assert cache.hits == 1 and cache.tokens_reused == 12
    torch.testing.assert_close(logits, uncached(model, base[:15]), **TOL)


def greedy(model: GPT, prompts: list[list[int]], cache: PrefixCache | None, n: int = 10) -> list[list[int]]:
    """Greedy continuations of a batch of prompts, as one decode (``loop.start`` + ``decode_rows``)."""
    config = SampleConfig(max_new_tokens=n, temperature=0.0)
    session, rows = start(model, None, prompts, config, None, prefix_cache=cache)
    out: dict[int, list[int]] = {}
    for event in decode_rows(session, rows):
        if event.token_id is not None:
            out.setdefault(event.index, []).append(event.token_id)
    return [out.get(i, []) for i in range(len(prompts))]


@pytest.mark.parametrize("pos", POSITIONS)
def test_greedy_output_is_the_same_with_the_cache_on_and_off(pos):
    """Batches of requests sharing a system prompt, then the same chat's next turn, twice over."""
    model = tiny(pos)
    system = ids_of(2, 20)
    first = [system + ids_of(10 + i, 3 + i) for i in range(3)]
    cache = PrefixCache(1 << 20, block_tokens=4)
    off = greedy(model, first, None)
    assert greedy(model, first, cache) == off  # cold: fills the cache
    assert greedy(model, first, cache) == off  # warm: every prompt reuses blocks
    assert cache.hits >= 3
    turn = first[0] + off[0] + ids_of(20, 4)  # the next turn starts with the first prompt and its reply
    before = cache.tokens_reused
    assert greedy(model, [turn], cache) == greedy(model, [turn], None)
    assert cache.tokens_reused - before >= (len(first[0]) + len(off[0])) // 4 * 4


def test_stream_events_reuses_the_cache_it_is_given(char_tok):
    model = tiny("rope", vocab_size=char_tok.vocab_size)
    config = SampleConfig(max_new_tokens=8, temperature=0.0)
    prompt = "a long system prompt, then: "
    cache = PrefixCache(1 << 20)

    def text(c: PrefixCache | None, p: str) -> str:
        return "".join(
            e.text for e in stream_events(model, char_tok, p, config, want_probs=False, prefix_cache=c)
        )

    assert text(cache, prompt + "a") == text(None, prompt + "a")
    assert text(cache, prompt + "b") == text(None, prompt + "b")
    assert cache.hits == 1 and cache.tokens_reused == (len(prompt + "b") - 1) // 16 * 16


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_a_row_past_the_context_leaves_only_keys_valid_for_its_window(pos):
    """A row that slid holds its window from position 0: what it leaves gives uncached logits."""
    model = tiny(pos, block_size=16)
    cache = PrefixCache(1 << 20, block_tokens=4)
    session = BatchSession(model, 1, prefix_cache=cache)
    prompt = ids_of(3, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextWarning)
        slot, _ = session.add(prompt)
        for t in ids_of(4, 12):  # past the context of 16: the window slides
            session.step({slot: t})
        held = list(session.tokens[slot])
        session.remove(slot)
    assert held != (prompt + ids_of(4, 12))[: len(held)]  # the window, not the prompt's start
    for probe in (held[:12] + [7], prompt + [7]):  # the window's start, the prompt's (stored at prefill)
        slot, logits = session.add(probe)
        torch.testing.assert_close(logits, uncached(model, probe), **TOL)
        session.remove(slot)
    assert cache.hits >= 2


def fake_extract(value: float, nbytes_per_block: int = 64):
    n = nbytes_per_block // 4
    return lambda a, b: [torch.full((1, 1, b - a, n // (b - a)), float(value))]


LAYOUT = ((torch.float32, (1, 1, 4)),)


def test_eviction_is_least_recently_used_first():
    cache = PrefixCache(3 * 64, block_tokens=4)  # room for three blocks of 64 bytes
    a, b, c, d = ([k] * 4 for k in (1, 2, 3, 4))
    for i, seq in enumerate((a, b, c)):
        cache.store(seq, LAYOUT, fake_extract(i))
    assert len(cache) == 3 and cache.bytes == 3 * 64
    assert cache.lookup(a + [0], LAYOUT)[0] == 4  # a is now the most recently used
    cache.store(d, LAYOUT, fake_extract(9))  # evicts b, the least recently used
    assert cache.evictions == 1
    assert cache.lookup(b + [0], LAYOUT)[0] == 0
    assert [cache.lookup(s + [0], LAYOUT)[0] for s in (a, c, d)] == [4, 4, 4]
    m, tensors = cache.lookup(d + [0], LAYOUT)
    assert float(tensors[0][0, 0, 0, 0]) == 9.0  # the blocks' own keys come back


def test_a_shared_prefix_is_evicted_after_the_blocks_that_continue_it():
    cache = PrefixCache(3 * 64, block_tokens=4)
    shared = [1] * 4
    cache.store(shared + [2] * 4, LAYOUT, fake_extract(0))  # shared, then its continuation
    cache.store(shared + [3] * 4, LAYOUT, fake_extract(1))  # one new block under the shared one
    assert len(cache) == 3
    cache.store([5] * 4, LAYOUT, fake_extract(2))  # evicts a leaf (the oldest continuation), never "shared"
    assert cache.lookup(shared + [2] * 4 + [0], LAYOUT)[0] == 4  # shared is still there; [2]*4 was evicted
    assert cache.lookup(shared + [3] * 4 + [0], LAYOUT)[0] == 8


def test_the_budget_is_never_exceeded_and_a_zero_budget_is_off():
    cache = PrefixCache(10 * 64, block_tokens=4)
    g = torch.Generator().manual_seed(0)
    for i in range(200):
        seq = torch.randint(0, 3, (int(torch.randint(4, 40, (1,), generator=g)),), generator=g).tolist()
        cache.lookup(seq, LAYOUT)
        cache.store(seq, LAYOUT, fake_extract(i))
        assert cache.bytes <= cache.budget_bytes and cache.bytes == 64 * len(cache)
    assert cache.evictions > 0 and cache.hits > 0
    off = PrefixCache(0)
    assert not off.enabled and off.store([1] * 8, LAYOUT, fake_extract(0)) == 0 and len(off) == 0
    session = BatchSession(tiny("rope"), 1, prefix_cache=off)
    assert session.prefix_cache is None  # a session never consults a cache that is off


def test_a_session_of_another_layout_neither_reads_nor_writes():
    model = tiny("rope")
    cache = PrefixCache(1 << 20, block_tokens=4)
    a = BatchSession(model, 1, prefix_cache=cache)
    slot, _ = a.add(ids_of(5, 12))
    a.remove(slot)
    held = len(cache)
    b = BatchSession(model, 1, cache_dtype=torch.int8, prefix_cache=cache)
    slot, logits = b.add(ids_of(5, 12))
    assert cache.hits == 0 and len(cache) == held
    b.remove(slot)
    assert len(cache) == held


def test_bad_budgets_are_refused():
    with pytest.raises(GptlabError, match="prefix-cache-mb"):
        budget_of(-1)
    with pytest.raises(GptlabError):
        PrefixCache(-5)
    assert budget_of(1.5) == 3 << 19


def test_gptlab_chat_prefills_only_what_each_turn_adds(tmp_path, monkeypatch, capsys):
    """Two turns of ``gptlab chat``: the 2nd turn's prefill is its new tokens (to a block), the rest reused."""
    import io

    import gptlab
    from gptlab.cli import chat as chat_cli
    from gptlab.cli import main
    from gptlab.tokenizers import CharTokenizer
    from gptlab.tokenizers.chat import template_for

    tok = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:\n.,?!'")
    model = tiny_model(vocab_size=tok.vocab_size, block_size=256, n_layer=1, n_head=2, pos="rope")
    ckpt = gptlab.save(model, tok, tmp_path / "ckpt")
    seen, real = [], chat_cli.reply

    def spy(model, tokenizer, template, messages, config, cache):
        seen.append((template.render(messages), cache))
        return real(model, tokenizer, template, messages, config, cache)

    monkeypatch.setattr(chat_cli, "reply", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there, how are you doing today?\nand then?\n"))
    assert main(["chat", str(ckpt), "--max-new-tokens", "12", "--system", "You are terse. " * 4]) == 0
    capsys.readouterr()
    (first, cache), (second, same) = seen
    assert same is cache and second.startswith(first)
    assert template_for(tok).name == "plain"
    p1, p2 = len(first), len(second)  # characters are tokens here
    assert cache.tokens_looked_up == p1 + p2 and cache.hits == 1
    assert p2 - cache.tokens_reused <= (p2 - p1) + cache.block_tokens  # only the new turn is prefilled
