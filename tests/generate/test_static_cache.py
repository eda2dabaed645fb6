"""The static path (fixed-shape cache, buckets, sampler in the step) agrees with the dynamic reference.

Everything here runs on the CPU with the step executed eagerly (``step="eager"``): the same
function a CUDA graph captures. ``test_the_compiled_step_*`` trace it through ``torch.compile``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gptlab.errors import GptlabError
from gptlab.generate import ContextWarning, SampleConfig, generate_ids
from gptlab.generate.prepared import prepare_decoding, prepared_of
from gptlab.generate.static import StaticSession, buckets_for
from tests.generate._static import GREEDY, PROMPTS, alone, eager_static, run, tiny

OPTIONS = [
    dict(pos="learned"),
    dict(pos="sinusoidal", n_kv_head=2),  # GQA
    dict(pos="rope", n_kv_head=2),
    dict(pos="rope", n_kv_head=1, qk_norm=True, mlp="relu2", norm="rmsnorm", bias=False),  # MQA
    dict(pos="alibi", n_kv_head=2),
    dict(pos="none"),
]


def use_static(model, config, cache_dtype=None, want_probs=False, batch=1):
    """True where the model's plan for this request is the static cache."""
    plan = prepared_of(model).plan(batch, config=config, cache_dtype=cache_dtype, want_probs=want_probs)
    return plan.session == "static"


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_greedy_tokens_equal_the_dynamic_path(options):
    model = tiny(**options)
    session = StaticSession(model, 4, 40, step="eager")
    got = run(session, PROMPTS[:3], 20)
    for slot, prompt in zip(sorted(got), PROMPTS[:3], strict=True):
        assert got[slot] == alone(model, prompt, 20), slot


@pytest.mark.parametrize("options", OPTIONS[:3], ids=lambda o: o["pos"])
def test_model_generate_takes_the_static_path_and_agrees(options):
    model = tiny(block_size=24, **options)
    idx = torch.tensor([p[:2] for p in PROMPTS[:3]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # learned positions reach the context limit (same on both paths)
        ref = generate_ids(model, idx, 30, temperature=0)
        eager_static(model)
        got = generate_ids(model, idx, 30, temperature=0)
    assert isinstance(prepared_of(model).static, StaticSession)  # it really ran the static path
    assert torch.equal(got, ref)
    prepare_decoding(model, static=False)


def test_buckets_and_a_batch_of_three_in_the_bucket_of_four():
    assert buckets_for(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets_for(1) == [1] and buckets_for(6) == [1, 2, 4, 6]
    model = tiny(pos="rope")
    session = StaticSession(model, 8, 40, step="eager")
    got = run(session, PROMPTS[:3], 12)
    assert session.bucket(3) == 4 and session.graphs == [(4, "greedy")]
    # the idle fourth row holds garbage: real rows must not notice
    clean = run(StaticSession(model, 8, 40, step="eager"), PROMPTS[:3], 6)
    dirty = StaticSession(model, 8, 40, step="eager")
    for i in range(model.config.n_layer):
        for t in dirty.cache.layer(i):
            t[3].normal_(0, 10)
    dirty.state.next_token[3], dirty.state.length[3] = 17, 30
    assert run(dirty, PROMPTS[:3], 6) == clean
    assert {s: t[:6] for s, t in got.items()} == clean


@pytest.mark.parametrize("lookahead", [1, 4])
def test_slots_join_and_leave_mid_stream_without_recapture(lookahead):
    model = tiny(pos="rope", n_kv_head=2)
    ref = [alone(model, p, 16) for p in PROMPTS]
    session = StaticSession(model, 4, 40, step="eager", lookahead=lookahead)
    got = {slot: [tok] for slot, tok in session.add_many(PROMPTS[:3], [GREEDY] * 3, [0] * 3)}
    owner = dict(zip(sorted(got), range(3), strict=True))
    finished = {}
    for step in range(1, 30):
        if step == 4:  # the first row leaves (the last row moves into its place) ...
            slot = min(got)
            finished[owner.pop(slot)] = got.pop(slot)
            session.remove(slot)
        if step == 6:  # ... and two join, into the same bucket of 4
            for (slot, tok), k in zip(
                session.add_many(PROMPTS[3:], [GREEDY] * 2, [0] * 2), (3, 4), strict=True
            ):
                got[slot], owner[slot] = [tok], k
        if step == 9:  # one that joined leaves while another keeps going
            slot = next(s for s, k in owner.items() if k == 3)
            finished[owner.pop(slot)] = got.pop(slot)
            session.remove(slot)
        live = [s for s in got if len(got[s]) < 16]
        for slot, tok in session.step(live).items():
            got[slot].append(tok)
    finished.update({owner[s]: toks for s, toks in got.items()})
    for k, toks in finished.items():
        assert toks == ref[k][: len(toks)] and len(toks) >= 4, k
    # 3 rows (bucket 4), 2 (bucket 2), 4 and 3 (bucket 4 again): each bucket was captured once
    assert session.graphs == [(2, "greedy"), (4, "greedy")] and session.captures == 2


@pytest.mark.parametrize("lookahead", [1, 3])
def test_a_paused_slot_keeps_its_state(lookahead):
    model = tiny(pos="learned")
    session = StaticSession(model, 2, 40, step="eager", lookahead=lookahead)
    (a, ta), (b, tb) = session.add_many(PROMPTS[:2], [GREEDY] * 2, [0, 0])
    seq_a, seq_b = [ta], [tb]
    for i in range(10):
        feed = [a, b] if i % 3 else [a]  # b waits every third step (a slow client)
        out = session.step(feed)
        seq_a.append(out[a])
        if b in out:
            seq_b.append(out[b])
    assert seq_a == alone(model, PROMPTS[0], len(seq_a))
    assert seq_b == alone(model, PROMPTS[1], len(seq_b))


@pytest.mark.parametrize("lookahead", [1, 3])
def test_a_cpu_step_attends_only_as_far_as_its_rows_reach(lookahead, monkeypatch):
    """On a CPU the step reads the cache up to a horizon (multiples of ``HORIZON``) past the longest
    row, not all ``T_max``: rows that cross horizons, join late and pause agree with the dynamic path."""
    import gptlab.generate.static as static

    monkeypatch.setattr(static, "HORIZON", 16)  # horizons 16, 32, 48, ... in a 120-token cache
    model = tiny(block_size=128, pos="rope", n_kv_head=2)
    session = StaticSession(model, 4, 120, step="eager", lookahead=lookahead)
    (a, ta), (b, tb) = session.add_many(PROMPTS[:2], [GREEDY] * 2, [0, 0])
    got = {a: [ta], b: [tb]}
    for i in range(60):
        if i == 25:  # a short prompt joins once the others are long
            ((c, tc),) = session.add_many(PROMPTS[3:4], [GREEDY], [0])
            got[c] = [tc]
        feed = [s for s in got if not (s == b and i % 4 == 0)]  # b pauses every fourth step
        for slot, tok in session.step(feed).items():
            got[slot].append(tok)
    for slot, prompt in ((a, PROMPTS[0]), (b, PROMPTS[1]), (c, PROMPTS[3])):
        assert got[slot] == alone(model, prompt, len(got[slot])), slot
    seen = session.horizons  # the cache lengths attended over
    assert min(seen) == 16 and max(seen) < 120 and len(seen) >= 4  # it grew with the rows


def test_sampled_tokens_do_not_depend_on_the_batch():
    model = tiny(pos="rope")
    cfg = SampleConfig(temperature=0.9, top_k=20, top_p=0.95, min_p=0.01, max_new_tokens=12)
    together = run(StaticSession(model, 4, 40, step="eager"), PROMPTS[:3], 12, [cfg] * 3, [5, 6, 7])
    for slot, prompt, seed in zip(sorted(together), PROMPTS[:3], (5, 6, 7), strict=True):
        single = run(StaticSession(model, 1, 40, step="eager"), [prompt], 12, [cfg], [seed])
        assert together[slot] == single[0]
    other = run(StaticSession(model, 1, 40, step="eager"), [PROMPTS[0]], 12, [cfg], [99])
    assert other[0] != together[min(together)]  # a different seed draws differently


@pytest.mark.parametrize("pos, lookahead", [("rope", 1), ("learned", 1), ("alibi", 1), ("rope", 5)])
def test_the_window_slides_past_the_context_like_the_dynamic_path(pos, lookahead):
    model = tiny(block_size=16, pos=pos)  # a 16-token context, 30 new tokens: the window slides
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextWarning)
        ref = alone(model, PROMPTS[0], 30)
        eager_static(model, lookahead=lookahead)
        got = alone(model, PROMPTS[0], 30)
    assert isinstance(prepared_of(model).static, StaticSession) and got == ref
    prepare_decoding(model, static=False)


def test_lookahead_runs_k_steps_per_sync_and_hands_out_the_same_tokens():
    """k steps back to back, one host read, the same tokens (greedy and seeded sampling)."""
    model = tiny(pos="rope", n_kv_head=2)
    cfg = SampleConfig(temperature=0.9, top_k=20, max_new_tokens=12)
    configs, seeds = [GREEDY, cfg, cfg], [0, 5, 6]
    one = run(StaticSession(model, 4, 40, step="eager"), PROMPTS[:3], 12, configs, seeds)
    ahead = StaticSession(model, 4, 40, step="eager", lookahead=4)
    assert run(ahead, PROMPTS[:3], 12, configs, seeds) == one
    assert ahead.host_reads == 3  # 11 steps after the prefill: 4 + 4 + 4 (one token left unused per row)
    with pytest.raises(GptlabError, match="lookahead"):
        StaticSession(model, 4, 40, step="eager", lookahead=0)


def test_a_late_row_catches_up_with_the_others_queues():
    """A row that joins while the others hold tokens ahead runs only as far as their queues."""
    model = tiny(pos="rope")
    session = StaticSession(model, 4, 40, step="eager", lookahead=4)
    got = {slot: [tok] for slot, tok in session.add_many(PROMPTS[:1], [GREEDY], [0])}
    got[min(got)].append(session.step(list(got))[min(got)])  # 4 chosen, 1 handed out: 3 queued
    ((late, tok),) = session.add_many(PROMPTS[1:2], [GREEDY], [0])
    got[late] = [tok]
    for _ in range(8):
        for slot, t in session.step(list(got)).items():
            got[slot].append(t)
    assert set(session.queued.values()) == {session.queued[late]}  # in step again
    for slot, prompt in zip(sorted(got), PROMPTS[:2], strict=True):
        assert got[slot] == alone(model, prompt, len(got[slot])), slot


def test_options_outside_the_graph_use_the_dynamic_path():
    model = eager_static(tiny())
    assert use_static(model, SampleConfig(temperature=0), None, want_probs=False)
    assert not use_static(model, SampleConfig(beam_width=2), None, want_probs=False)
    every = dict(
        top_k=5, top_p=0.9, min_p=0.1, stop=["x"], seed=1, repetition_penalty=1.3, logit_bias={3: 5.0}
    )
    assert use_static(model, SampleConfig(**every))
    assert not use_static(model, SampleConfig(), torch.int8, want_probs=False)
    assert not use_static(model, SampleConfig(), None, want_probs=True)
    assert not use_static(tiny(), SampleConfig(), None, want_probs=False)  # CPU: the dynamic reference
    alibi_bf16 = eager_static(tiny(pos="alibi").to(torch.bfloat16))
    assert not use_static(alibi_bf16, SampleConfig(), None, want_probs=False)  # its bias would round
    beams = dict(beam_width=2, temperature=0)
    assert alone(model, PROMPTS[0], 6, **beams) == alone(tiny(), PROMPTS[0], 6, **beams)


PENALTIES = [
    dict(repetition_penalty=1.8),
    dict(frequency_penalty=0.7, presence_penalty=0.4),
    dict(repetition_penalty=0.7, logit_bias={5: 2.0, 11: -100.0, 60: 1.5}),
]


@pytest.mark.parametrize("penalty", PENALTIES, ids=["repetition", "frequency-presence", "bias"])
def test_penalties_and_logit_bias_inside_the_graph_equal_the_sampler(penalty):
    model = tiny(pos="rope", n_kv_head=2)
    cfgs = [SampleConfig(temperature=0, **penalty)] * 3
    session = StaticSession(model, 4, 40, step="eager")
    got = {slot: [tok] for slot, tok in session.add_many(PROMPTS[:3], cfgs, [0] * 3)}
    first = min(got)
    done = {}
    for step in range(1, 16):
        if step == 5:  # a row leaves: the last row's counts move into its place
            done[first] = got.pop(first)
            session.remove(first)
        for slot, tok in session.step(list(got)).items():
            got[slot].append(tok)
    got.update(done)
    for slot, prompt in zip(sorted(got), PROMPTS[:3], strict=True):
        ref = alone(model, prompt, len(got[slot]), **penalty)
        assert got[slot] == ref, slot
        if 11 in penalty.get("logit_bias", {}):
            assert 11 not in got[slot]


@pytest.mark.slow  # dynamo traces the model twice: ~10 s alone, over 20 s on a busy machine
def test_the_compiled_step_is_really_used_and_agrees():
    """``fullgraph=True`` through dynamo: a graph break (which would lose the CUDA graph) fails here."""
    from torch._dynamo.utils import counters

    model = tiny(pos="rope", n_kv_head=2, n_layer=1)  # one layer: dynamo traces it in seconds
    eager = run(StaticSession(model, 4, 40, step="eager"), PROMPTS[:3], 6)
    before = counters["stats"]["unique_graphs"]
    session = StaticSession(
        model, 4, 40, step="compiled", compile_options={"backend": "eager", "fullgraph": True}
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*torch.compile failed")  # a fallback to eager
        got = run(session, PROMPTS[:3], 6)
        traced = counters["stats"]["unique_graphs"]
        session.remove(min(got))  # two rows now: the bucket of 2, the same compiled step
        rest = [session.step([s for s in got if s != min(got)]) for _ in range(3)]
    assert session.compiled and session.prefill_step.enabled
    assert traced == before + 2  # the prefill and the step (the bucket is a symbol) ...
    assert counters["stats"]["unique_graphs"] == traced  # ... so a new bucket traced nothing new
    assert session.graphs == [(2, "greedy"), (4, "greedy")]
    assert got == eager
    eager_session = StaticSession(model, 4, 40, step="eager")
    run(eager_session, PROMPTS[:3], 6)
    eager_session.remove(min(got))
    assert rest == [eager_session.step([s for s in got if s != min(got)]) for _ in range(3)]


def test_a_failed_compilation_is_visible():
    model = tiny()
    session = StaticSession(model, 2, 40, step="compiled", compile_options={"backend": "no-such-backend"})
    with pytest.warns(UserWarning, match="torch.compile failed"):
        got = run(session, PROMPTS[:1], 3)
    assert not session.compiled  # what bench/gpu.py reports, so a slow fallback is never a silent one
    assert got[0] == alone(model, PROMPTS[0], 3)
