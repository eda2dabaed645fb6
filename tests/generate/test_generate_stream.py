"""Streaming text: UTF-8 safety, stop strings, batched == one by one, stream events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.generate import SampleConfig, TextStream, generate_batch, generate_text, stream, stream_events
from gptlab.tokenizers import BPETokenizer, CharTokenizer
from tests._tiny import tiny_model


class BytesTokenizer:
    """A stand-in whose tokens are arbitrary byte strings (so tokens can split UTF-8 characters)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.vocab_size, self.eot_id = len(pieces), None

    def token_bytes(self, i: int) -> bytes:
        return self.pieces[i]

    def decode(self, ids) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    cuts = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\ufffd")),
    cuts=st.lists(st.integers(0, 400), max_size=30),
)
def test_streaming_never_splits_a_character(text, cuts):
    pieces = _chunks(text.encode("utf-8"), cuts)
    stream_ = TextStream(BytesTokenizer(pieces))
    out = [stream_.push(i) for i in range(len(pieces))] + [stream_.finish()]
    assert all("\ufffd" not in piece for piece in out)  # no piece ever ended inside a character
    assert "".join(out) == text


@settings(max_examples=150, deadline=None)
@given(
    data=st.binary(max_size=60),
    cuts=st.lists(st.integers(0, 100), max_size=20),
    stop=st.text(min_size=1, max_size=3),
)
def test_any_bytes_stream_as_valid_utf8_and_stop_strings_cut_exactly(data, cuts, stop):
    pieces = _chunks(data, cuts)
    stream_ = TextStream(BytesTokenizer(pieces), [stop])
    out = [stream_.push(i) for i in range(len(pieces))] + [stream_.finish()]
    for piece in out:
        piece.encode("utf-8")  # valid: no lone surrogates
    full = data.decode("utf-8", errors="replace")
    expected = full[: full.find(stop)] if stop in full else full
    assert "".join(out) == expected and stream_.stopped == (stop in full)


def test_held_back_text_is_released_when_the_stop_string_fails_to_complete():
    tok = BytesTokenizer([b"hel", b"lo wo", b"rl", b"d!", b"rk"])
    s = TextStream(tok, ["world"])
    assert [s.push(0), s.push(1), s.push(2)] == ["hel", "lo ", ""]  # "wo", "worl" may start "world"
    assert s.push(4) == "worlrk" and not s.stopped
    s = TextStream(tok, ["world"])
    assert "".join(s.push(i) for i in range(4)) == "hello " and s.stopped


CORPUS = "the quick brown fox jumps over the lazy dog. ça coûte 5€ — naïve 日本語 🙂\n" * 3


@pytest.fixture(scope="module")
def char_model():
    tok = CharTokenizer.from_text(CORPUS, special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, n_head=2, pos="rope", init_std=0.2)
    return model, tok


@pytest.fixture(scope="module")
def bpe_model():
    tok = BPETokenizer.train(CORPUS, vocab_size=300, special_tokens=["<|endoftext|>"])
    model = tiny_model(seed=1, vocab_size=tok.vocab_size, n_head=2, pos="learned", init_std=0.3)
    return model, tok


def test_stop_strings_cut_generated_text_exactly(char_model):
    model, tok = char_model
    config = SampleConfig(max_new_tokens=40, seed=5)
    free = generate_text(model, tok, "the ", config)
    assert len(free) > 6
    stop = free[4:6]
    cut = generate_text(model, tok, "the ", config.replace(stop=[stop]))
    assert cut == free[: free.find(stop)]


@pytest.mark.parametrize("fixture", ["char_model", "bpe_model"])
@pytest.mark.parametrize(
    "options",
    [
        dict(temperature=0),
        dict(temperature=0.9, top_k=20, seed=3),
        dict(top_p=0.9, min_p=0.05, frequency_penalty=0.3, seed=4),
    ],
)
def test_batched_generation_equals_one_by_one(request, fixture, options):
    model, tok = request.getfixturevalue(fixture)
    prompts = ["the quick", "ç", "over the lazy dog. ça", "日本"]
    config = SampleConfig(max_new_tokens=12, **options)
    alone = [generate_text(model, tok, p, config) for p in prompts]
    assert generate_batch(model, tok, prompts, config) == alone


def test_stream_events_carry_probabilities_and_alternatives(bpe_model):
    model, tok = bpe_model
    events = list(stream_events(model, tok, "the", SampleConfig(max_new_tokens=8, temperature=0)))
    tokens = [e for e in events if e.token_id is not None]
    assert len(tokens) <= 8 and events[-1].finish_reason in ("length", "stop", "context")
    for e in tokens:
        assert (
            e.top[0][1] == pytest.approx(e.prob) and len(e.top) == 5
        )  # greedy: the chosen token is the top one
        assert all(a[1] >= b[1] for a, b in zip(e.top, e.top[1:], strict=False))
    assert "".join(e.text for e in events) == tok.decode([e.token_id for e in tokens])
    assert "".join(stream(model, tok, "the", SampleConfig(max_new_tokens=8, temperature=0))) == "".join(
        e.text for e in events
    )


def test_beam_search_streams_its_best_sequence(char_model):
    model, tok = char_model
    text = generate_text(model, tok, "the", SampleConfig(max_new_tokens=6, beam_width=3))
    assert 0 < len(text) <= 6
    assert generate_batch(model, tok, ["the", "fox"], SampleConfig(max_new_tokens=6, beam_width=3))[0] == text
