"""Generation past the context, prompts cut to leave room, logit bias, and the shared per-token step."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gptlab
from gptlab.cli import main
from gptlab.errors import GptlabError
from gptlab.generate import (
    ContextWarning,
    RequestState,
    SampleConfig,
    Sampler,
    fit_prompt,
    generate_ids,
    generate_text,
    stream_events,
)
from gptlab.generate.request import prompt_budget
from gptlab.model import GPT
from gptlab.tokenizers import CharTokenizer
from tests._tiny import tiny_model

TEXT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,.:\n"
POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "none"]


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(TEXT)  # no <|endoftext|>: only max_new_tokens ends a sample


def tiny(tok: CharTokenizer, pos: str, block_size: int = 16) -> GPT:
    return tiny_model(
        vocab_size=tok.vocab_size, block_size=block_size, n_layer=1, n_head=2, n_embd=16, pos=pos
    )


def test_prompt_budget_leaves_room_for_new_tokens_up_to_half_the_context():
    assert [prompt_budget(64, n) for n in (0, 1, 20, 32, 33, 500)] == [64, 63, 44, 32, 32, 32]
    ids, message = fit_prompt(list(range(100)), 64, 20)
    assert ids == list(range(56, 100)) and "last 44 tokens" in message
    assert fit_prompt([1, 2, 3], 64, 500) == ([1, 2, 3], None)


@pytest.mark.parametrize("pos", POSITIONS)
def test_every_position_writes_past_the_context_with_one_notice(tok, pos):
    model = tiny(tok, pos)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = list(stream_events(model, tok, "the cat sat", SampleConfig(max_new_tokens=50, seed=1)))
    tokens = [e for e in events if e.token_id is not None]
    assert len(tokens) == 50 and events[-1].finish_reason == "length"
    notices = [e for e in events if e.notice]
    assert len(notices) == 1 and "sliding window of the last 16 tokens" in notices[0].notice
    slides = [w for w in caught if issubclass(w.category, ContextWarning) and "sliding" in str(w.message)]
    assert len(slides) == 1


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_greedy_past_the_context_equals_the_uncached_window(tok, pos):
    """Absolute positions re-run the last block_size tokens: nanoGPT's ``idx[:, -block_size:]`` loop."""
    model = tiny(tok, pos)
    prompt = tok.encode("abc")
    got = generate_ids(model, torch.tensor([prompt]), 40, temperature=0)[0].tolist()
    if pos == "learned":
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(40):
                ids.append(int(model(torch.tensor([ids[-16:]]))[0, -1].argmax()))
        assert got == ids
    assert len(got) == 3 + 40


def test_slide_false_stops_at_the_context_with_finish_reason_context(tok):
    model = tiny(tok, "learned")
    with pytest.warns(ContextWarning, match="context limit"):
        events = list(stream_events(model, tok, "ab", SampleConfig(max_new_tokens=50, slide=False, seed=0)))
    assert events[-1].finish_reason == "context"
    assert sum(e.token_id is not None for e in events) == 16 - 2 + 1


def test_a_long_prompt_is_cut_from_the_left_to_leave_room(tok):
    model = tiny(tok, "learned")
    prompt = "abcdefghijklmnopqrstuvwxyz"  # 26 tokens, context 16
    with pytest.warns(ContextWarning, match="cut to its last 12 tokens"):
        text = generate_text(model, tok, prompt, SampleConfig(max_new_tokens=4, temperature=0))
    assert text == generate_text(model, tok, prompt[-12:], SampleConfig(max_new_tokens=4, temperature=0))


def test_logit_bias_bans_and_forces_tokens_and_round_trips(tok):
    logits = torch.zeros(tok.vocab_size)
    logits[3] = 5.0
    forced = Sampler(SampleConfig(logit_bias={7: 100}, seed=0), tok.vocab_size)
    assert {forced(logits, []) for _ in range(20)} == {7}
    banned = Sampler(SampleConfig(temperature=0, logit_bias={3: -100}), tok.vocab_size)
    assert banned(logits, []) != 3
    c = SampleConfig(logit_bias={"5": -2.5})  # JSON keys are strings
    assert c.logit_bias == {5: -2.5} and SampleConfig.from_dict(c.to_dict()) == c
    for bad in ({5: 101}, {-1: 1.0}, {"x": 1.0}, [1, 2]):
        with pytest.raises(GptlabError, match="logit_bias"):
            SampleConfig(logit_bias=bad)


def test_token_step_reports_log_probabilities_of_the_raw_distribution(tok):
    """Temperature and top-k choose the token; its reported log p is the raw logits' (OpenAI's logprobs)."""
    model = tiny(tok, "rope")
    config = SampleConfig(temperature=0.7, top_k=3, seed=2)
    step = RequestState(config, tok, model, [1, 2], top_n=5)
    logits = torch.randn(tok.vocab_size, generator=torch.Generator().manual_seed(0))
    event = step.advance(logits)
    raw = torch.log_softmax(logits, -1)
    assert event.token_id in raw.topk(3).indices.tolist()  # drawn from the top 3 …
    assert event.logprob == pytest.approx(float(raw[event.token_id]))  # … reported under the raw distribution
    assert event.prob == pytest.approx(math.exp(event.logprob))
    assert [a.logprob for a in event.top] == pytest.approx(raw.topk(5).values.tolist())
    assert all(a.prob > 0.0 for a in event.top)  # outside the top-k too
    assert step.reason is None and step.token == event.token_id
    stop = RequestState(SampleConfig(stop_tokens=[4], logit_bias={4: 100}), tok, model, [1])
    assert stop.advance(logits) is None and stop.reason == "stop" and stop.close().finish_reason == "stop"


@pytest.fixture(scope="module")
def default_ckpt(tmp_path_factory, tok):
    """The shape of the old default preset: learned positions, context 64."""
    model = tiny_model(
        vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16, pos="learned"
    )
    return gptlab.save(model, tok, tmp_path_factory.mktemp("window") / "c")


def test_cli_sample_writes_500_tokens_past_a_context_of_64(default_ckpt, capsys):
    assert (
        main(
            [
                "sample",
                str(default_ckpt),
                "--prompt",
                "ROMEO:",
                "--max-new-tokens",
                "500",
                "--seed",
                "1",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert len(out) == len("ROMEO:") + 500 + 1  # one character per token, then a newline
    assert err.count("note: ") == 1 and "sliding window" in err and "warning" not in err
    assert err.strip().splitlines()[-1].startswith("500 tokens in")


def test_cli_prompt_file_directory_is_one_clear_line(default_ckpt, tmp_path, capsys):
    assert main(["sample", str(default_ckpt), "--prompt-file", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "is a directory" in err and "not found" not in err
