"""Prompt-lookup decoding: drafts from the text so far, verified in one pass, never change the output."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.generate import generate_ids, prepare_decoding
from gptlab.generate.config import SampleConfig
from gptlab.generate.driver import decode_rows, start
from gptlab.generate.lookup import PAUSES, REJECTIONS_BEFORE_PAUSE, Backoff, NgramIndex
from gptlab.generate.plan import DecodeSettings, ModelFacts, plan_decoding
from gptlab.generate.session import BatchSession

LOOPING = [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]]
SAMPLINGS = [
    {"temperature": 0.0},
    {"temperature": 0.9, "seed": 3, "top_k": 20},
    {"temperature": 0.0, "repetition_penalty": 1.3, "frequency_penalty": 0.5},
    {"temperature": 1.2, "seed": 11, "top_p": 0.9, "min_p": 0.05, "presence_penalty": 0.4},
]


@given(st.lists(st.integers(0, 4), max_size=40), st.integers(1, 6))
@settings(max_examples=200, deadline=None)
def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix(tokens, k):
    index = NgramIndex(tokens, max_ngram=3, min_ngram=2)
    draft = index.draft(k)
    found = None
    for n in range(min(3, len(tokens)), 1, -1):
        suffix = tokens[len(tokens) - n :]
        starts = [j for j in range(len(tokens) - n) if tokens[j : j + n] == suffix]
        if starts:
            found = tokens[starts[-1] + n : starts[-1] + n + k]
            break
    assert draft == (found or [])


def test_backoff_pauses_after_rejections_and_resumes_on_an_accepted_draft():
    b = Backoff()
    for _ in range(REJECTIONS_BEFORE_PAUSE):
        assert b.ready()
        b.record(0)
    paused = 0
    while not b.ready():
        paused += 1
    assert paused == PAUSES[0]
    for _ in range(REJECTIONS_BEFORE_PAUSE):
        b.record(0)
    paused = 0
    while not b.ready():
        paused += 1
    assert paused == PAUSES[1]  # the second pause is longer
    b.record(2)  # a draft accepted in part: drafting goes on at once, pauses start short again
    assert b.ready() and b.pauses == 0


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "none"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "top-k", "penalties", "top-p"])
def test_the_output_is_plain_decodings_for_every_position_and_sampler(tiny_model, pos, sampling):
    # 40 new tokens in a context of 32: the window slides while drafting
    model = tiny_model(pos=pos, jitter=0.5)
    prompt = torch.tensor(LOOPING)
    with pytest.warns(Warning):
        plain = generate_ids(model, prompt, 40, prompt_lookup="off", **sampling)
    with pytest.warns(Warning):
        drafted = generate_ids(model, prompt, 40, prompt_lookup="on", **sampling)
    assert torch.equal(plain, drafted)


@pytest.mark.parametrize("stop", [[22], [47], [53]])
def test_stop_tokens_and_the_token_limit_end_a_drafted_row_where_they_end_a_plain_one(tiny_model, stop):
    model = tiny_model(pos="rope", jitter=0.5)
    for n in (1, 2, 5, 13):
        config = {"temperature": 0.0, "stop_tokens": stop}
        plain = generate_ids(model, torch.tensor([LOOPING[0][:12]]), n, prompt_lookup="off", **config)
        drafted = generate_ids(model, torch.tensor([LOOPING[0][:12]]), n, prompt_lookup="on", **config)
        assert torch.equal(plain, drafted)


def test_drafts_are_accepted_where_the_text_repeats(tiny_model):
    # a random model's greedy text falls into loops: drafts from the loop are accepted, and each
    # accepted token is a forward pass saved
    accepted = 0
    for pos in ("rope", "alibi", "none"):
        model = tiny_model(pos=pos, jitter=0.5)
        config = SampleConfig(max_new_tokens=14, temperature=0.0, prompt_lookup="on")
        session, rows = start(model, None, [LOOPING[0][:16]], config, None)
        tokens = [e.token_id for e in decode_rows(session, rows) if e.token_id is not None]
        stats = rows[0].drafter.stats
        assert stats.accepted <= stats.drafted and len(tokens) == 14
        accepted += stats.accepted
    assert accepted > 0


def test_extend_computes_what_one_token_steps_compute_and_rewind_takes_tokens_back(tiny_model):
    model = tiny_model(pos="rope", jitter=0.5)
    one, many = BatchSession(model, 1), BatchSession(model, 1)
    slot, _ = one.add([1, 2, 3])
    many.add([1, 2, 3])
    stepped = torch.stack([one.step({slot: t})[slot] for t in (4, 5, 6)])
    extended = many.extend(slot, [4, 5, 6])
    torch.testing.assert_close(extended, stepped, rtol=1e-5, atol=1e-5)
    many.rewind(slot, 2)  # back to [1, 2, 3, 4]
    assert many.tokens[slot] == [1, 2, 3, 4] and many.length(slot) == 4
    one2 = BatchSession(model, 1)
    one2.add([1, 2, 3, 4])
    torch.testing.assert_close(many.step({slot: 9})[slot], one2.step({slot: 9})[slot], rtol=1e-5, atol=1e-5)


def test_the_plan_drafts_for_one_sequence_unless_asked_not_to():
    facts = ModelFacts(device="cpu", compiler=False, matrix_bytes=0)
    settings = DecodeSettings()
    on = plan_decoding(facts, settings, 1, config=SampleConfig())
    assert on.draft == "prompt-lookup" and "prompt-lookup drafts" in str(on)
    assert plan_decoding(facts, settings, 1, config=SampleConfig(prompt_lookup="off")).draft == "none"
    assert plan_decoding(facts, settings, 3, config=SampleConfig(prompt_lookup="on")).draft == "none"
    assert plan_decoding(facts, settings, 1, config=SampleConfig(beam_width=2)).draft == "none"


def test_what_the_plan_prints_is_what_runs(tiny_model):
    model = tiny_model(pos="rope", jitter=0.5)
    prepare_decoding(model)
    for mode, drafts in (("on", True), ("auto", True), ("off", False)):
        config = SampleConfig(max_new_tokens=4, temperature=0.0, prompt_lookup=mode)
        _, rows = start(model, None, [LOOPING[0][:8]], config, None)
        assert (rows[0].drafter is not None) is drafts
    _, rows = start(
        model, None, [LOOPING[0][:8]] * 2, SampleConfig(max_new_tokens=4, prompt_lookup="on"), None
    )
    assert all(r.drafter is None for r in rows)


def test_an_unknown_mode_is_refused():
    with pytest.raises(Exception, match="prompt_lookup must be one of auto, on, off"):
        SampleConfig(prompt_lookup="sometimes")


def test_auto_leaves_drafts_out_beside_the_compiled_one_row_step():
    facts = ModelFacts(device="cpu", compiler=True, matrix_bytes=0)
    settings = DecodeSettings(compile="on")
    auto = plan_decoding(facts, settings, 1, config=SampleConfig())
    assert auto.step == "fused" and auto.draft == "none"
    on = plan_decoding(facts, settings, 1, config=SampleConfig(prompt_lookup="on"))
    assert on.step == "fused" and on.draft == "prompt-lookup"


def test_auto_leaves_drafts_out_in_bf16_activations():
    # a wider pass rounds otherwise in bf16: a near-tie could resolve the other way
    facts = ModelFacts(
        device="cpu", compiler=False, matrix_bytes=0, weights="bf16", activations=torch.bfloat16
    )
    assert plan_decoding(facts, DecodeSettings(), 1, config=SampleConfig()).draft == "none"
    assert (
        plan_decoding(facts, DecodeSettings(), 1, config=SampleConfig(prompt_lookup="on")).draft
        == "prompt-lookup"
    )
