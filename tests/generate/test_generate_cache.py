"""KV-cached decoding equals the uncached model: every positional option, GQA/MQA, norms, MLPs."""

from __future__ import annotations

import warnings

import pytest
import torch

from gptlab.errors import GptlabError
from gptlab.generate import BatchSession, ContextWarning, generate_ids
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.model import GPT, KVCache
from tests._tiny import tiny_model

OPTIONS = [
    dict(pos="learned"),
    dict(pos="sinusoidal"),
    dict(pos="rope"),
    dict(pos="alibi"),
    dict(pos="none"),
    dict(pos="rope", n_kv_head=1),  # MQA
    dict(pos="alibi", n_kv_head=2, norm_placement="post"),  # GQA, post-norm
    dict(pos="learned", mlp="swiglu", norm="rmsnorm", n_kv_head=2),
    dict(pos="rope", qk_norm=True, mlp="relu2", bias=False),
]
TOL = dict(atol=1e-5, rtol=1e-5)


def tiny(block_size: int = 24, **options) -> GPT:
    return tiny_model(block_size=block_size, init_std=0.3, **options)


def uncached(model: GPT, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0, -1]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_cached_logits_equal_uncached_at_every_step(options):
    model = tiny(**options)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 61, (n,), generator=g).tolist() for n in (14, 13, 12)]
    # ragged rows: prompts of different lengths prefilled one by one, then stepped together
    session = BatchSession(model, max_batch=3)
    filled = [session.add(s[: 4 + i]) for i, s in enumerate(seqs)]
    logits = {slot: lg for slot, lg in filled}
    slots = [slot for slot, _ in filled]
    lengths = {slot: 4 + i for i, slot in enumerate(slots)}
    for _ in range(5):
        for slot, seq in zip(slots, seqs, strict=True):
            torch.testing.assert_close(logits[slot], uncached(model, seq[: lengths[slot]]), **TOL)
        logits = session.step({slot: seq[lengths[slot]] for slot, seq in zip(slots, seqs, strict=True)})
        for slot in slots:
            lengths[slot] += 1
    # left-padded prefill of the same prompts in one pass, then lock-step decoding
    session = BatchSession(model, max_batch=3)
    filled = session.add_many([s[:5] for s in seqs[:2]] + [seqs[2][:2]])
    for (_, lg), seq, n in zip(filled, seqs, (5, 5, 2), strict=True):
        torch.testing.assert_close(lg, uncached(model, seq[:n]), **TOL)
    stepped = session.step({slot: seq[n] for (slot, _), seq, n in zip(filled, seqs, (5, 5, 2), strict=True)})
    for (slot, _), seq, n in zip(filled, seqs, (5, 5, 2), strict=True):
        torch.testing.assert_close(stepped[slot], uncached(model, seq[: n + 1]), **TOL)


@pytest.mark.parametrize("cache_dtype", [None, torch.float32])
def test_a_bf16_prompt_after_a_cached_prefix_gives_the_whole_prompts_logits(cache_dtype):
    """bf16 weights, over a float32 cache (the CPU's default) or their own: a prompt whose first keys
    are read back from the prefix cache gets the logits it gets prefilled whole, bit for bit."""
    model = tiny(pos="rope", n_kv_head=2).to(torch.bfloat16)
    ids = torch.randint(0, 61, (11,), generator=torch.Generator().manual_seed(5)).tolist()
    session = BatchSession(
        model, 3, cache_dtype=cache_dtype, prefix_cache=PrefixCache(1 << 20, block_tokens=4)
    )
    (_, logits), (_, shorter) = session.add_many([ids, ids[:9]])  # the shorter row left-padded
    torch.testing.assert_close(logits, uncached(model, ids).float(), atol=0.05, rtol=0.05)
    torch.testing.assert_close(shorter, uncached(model, ids[:9]).float(), atol=0.05, rtol=0.05)
    reused = session.prefix_cache.tokens_reused
    after_prefix = session.add(ids[:10])[1]
    assert session.prefix_cache.tokens_reused - reused == 8  # the first 8 read back from the cache
    whole = BatchSession(model, 1, cache_dtype=cache_dtype).add(ids[:10])[1]
    assert torch.equal(after_prefix, whole)


@pytest.mark.parametrize("impl", ["sdpa", "plain"])
def test_model_run_with_kvcache_matches_both_attention_paths(impl):
    model = tiny(pos="rope", n_kv_head=2).set_attention_impl(impl)
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(2))
    full = model(ids)
    cache = KVCache(model.config, batch=2, max_len=10)
    with torch.no_grad():
        first = model.run(ids[:, :6], cache=cache).logits
        steps = [model.run(ids[:, t : t + 1], cache=cache).logits for t in range(6, 10)]
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, **TOL)
    assert cache.length == 10


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 0.1), (torch.int8, 0.05)])
def test_low_precision_caches_stay_close_and_are_smaller(dtype, tol):
    model = tiny(pos="alibi")
    ids = torch.randint(0, 61, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    session = BatchSession(model, 1, cache_dtype=dtype)
    slot, logits = session.add(ids[:6])
    for t in range(6, 12):
        ref = uncached(model, ids[:t])
        assert (logits - ref).abs().max() < tol * ref.abs().max()
        logits = session.step({slot: ids[t]})[slot]
    fp32 = KVCache(model.config, 1, 24).nbytes()
    assert KVCache(model.config, 1, 24, dtype=dtype).nbytes() < 0.6 * fp32


@pytest.mark.parametrize("pos", ["rope", "alibi", "none"])
def test_a_full_row_slides_and_equals_the_model_on_the_kept_window(pos):
    model = tiny(block_size=12, pos=pos)
    ids = torch.randint(0, 61, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    session = BatchSession(model, 1)
    slot, _ = session.add(ids[:12])
    for t in range(12, 30):
        out = session.step({slot: ids[t]})[slot]
        window = session.tokens[slot]
        assert window == ids[t + 1 - len(window) : t + 1] and len(window) <= 12
        torch.testing.assert_close(out, uncached(model, window), **TOL)


def test_learned_positions_stop_at_the_limit_and_say_so_with_slide_false():
    model = tiny(block_size=12, pos="learned")
    idx = torch.randint(0, 61, (2, 8))
    with pytest.warns(ContextWarning, match="context limit"):
        out = generate_ids(model, idx, 10, temperature=0, slide=False)
    # the prompt keeps 12 − min(10, 6) = 6 tokens; 6 more positions fill the context, plus the token they predict
    assert out.shape == (2, 8 + 6 + 1)
    session = BatchSession(model, 1)
    slot, _ = session.add(list(range(12)))
    assert session.full(slot)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "none"])
def test_every_position_goes_past_the_context_over_the_last_block_size_tokens(pos):
    """Past the context each step's logits equal the uncached model on the window the row holds;
    absolute positions re-run the whole last ``block_size`` tokens (nanoGPT's window)."""
    model = tiny(block_size=12, pos=pos)
    ids = torch.randint(0, 61, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    session = BatchSession(model, 1)
    slot, _ = session.add(ids[:10])
    for t in range(10, 40):
        out = session.step({slot: ids[t]})[slot]
        window = session.tokens[slot]
        assert window == ids[t + 1 - len(window) : t + 1] and len(window) <= 12
        if not session.window.can_slide:
            assert len(window) == min(t + 1, 12)
        torch.testing.assert_close(out, uncached(model, window), **TOL)
    with pytest.warns(ContextWarning, match="sliding window") as caught:
        out = generate_ids(model, torch.tensor([ids[:4]]), 30, temperature=0)
    assert out.shape == (1, 34)  # every requested token, 22 of them past the context
    assert sum("sliding window" in str(w.message) for w in caught) == 1  # the notice comes once


def test_a_long_prompt_is_cut_to_the_context_with_a_warning():
    model = tiny(block_size=12, pos="rope")
    ids = list(range(20))
    with pytest.warns(ContextWarning, match="keeping its last 12"):
        slot_logits = BatchSession(model, 1).add(ids)[1]
    torch.testing.assert_close(slot_logits, uncached(model, ids[-12:]), **TOL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BatchSession(model, 1).add(ids[:12])  # fits: no warning


def test_session_slots_are_reused_and_errors_name_the_fix():
    model = tiny()
    session = BatchSession(model, 2)
    a, _ = session.add([1, 2])
    b, _ = session.add([3])
    assert session.free_slots == 0 and session.length(a) == 2 and session.length(b) == 1
    with pytest.raises(GptlabError, match="free slot"):
        session.add([4])
    session.remove(a)
    c, _ = session.add([5, 6, 7])
    assert c == a and session.length(c) == 3
    with pytest.raises(GptlabError, match="not in use"):
        session.step({a + 5: 1})
    with pytest.raises(GptlabError, match="empty"):
        BatchSession(model, 1).add([])
    with pytest.raises(GptlabError, match="vocabulary"):
        BatchSession(model, 1).add([999])


def test_half_precision_models_cache_in_float32_on_cpu_unless_told():
    model = tiny(pos="rope").to(torch.bfloat16)
    assert BatchSession(model, 1).stores[0].k.dtype == torch.float32  # bf16 attention is slow on CPU
    assert BatchSession(model, 1, cache_dtype=torch.bfloat16).stores[0].k.dtype == torch.bfloat16
    assert BatchSession(tiny(), 1).stores[0].k.dtype == torch.float32
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    session = BatchSession(model, 1)
    slot, logits = session.add(ids[:4])
    for t in range(4, len(ids)):
        ref = uncached(model, ids[:t]).float()
        assert logits.dtype == torch.float32
        assert (logits - ref).abs().max() <= 0.05 * ref.abs().max()  # bf16 activations either way
        logits = session.step({slot: ids[t]})[slot]
