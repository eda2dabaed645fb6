"""A batch's grammar masks computed together (``grammar.fill_masks``) and applied as one tensor
operation (``sampling.apply_grammar_mask``): the same masks and the same logits as row by row."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from gptlab.errors import GptlabError
from gptlab.generate import SampleConfig, sampling
from gptlab.generate import grammar as grammar_module
from gptlab.generate.grammar import Constraint
from gptlab.generate.sampling import apply_grammar_mask
from gptlab.tokenizers import CharTokenizer
from tests._structured import JSON_ALPHABET, SCHEMAS


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(JSON_ALPHABET, special_tokens=["<|endoftext|>"])


def reference_mask(c: Constraint) -> torch.Tensor:
    """The row's mask computed alone, as the module documents it: the engine's bits of a copy of the
    matcher, the end id that is not a stop cleared, special stops set exactly where the text is
    complete, ordinary (text) stops kept only there."""
    matcher = c.matcher.deep_copy()
    packed = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    bits = np.unpackbits(packed, count=c.vocab, bitorder="little").astype(bool)
    if c.end is not None:
        bits[c.end] = False
    complete = bool(matcher.is_accepting())
    for i in c._special:
        bits[i] = complete
    for i in c._text:
        bits[i] = bits[i] and complete
    return torch.from_numpy(bits)


def test_masks_computed_together_equal_each_row_alone(tok, monkeypatch):
    plain = CharTokenizer.from_text(JSON_ALPHABET)  # no end-of-text: an id past the vocabulary ends
    underscore = tok.encode("_")[0]  # a stop that is also text of the regex: allowed only where complete
    rows = [
        Constraint(SampleConfig(json_schema=SCHEMAS["flat"]), tok, tok.vocab_size, {tok.eot_id}),
        Constraint(SampleConfig(json_schema=SCHEMAS["nested"]), tok, tok.vocab_size, {tok.eot_id}),
        Constraint(SampleConfig(regex="_?[a-c]{1,3}_?"), tok, tok.vocab_size, {tok.eot_id, underscore}),
        Constraint(SampleConfig(json_schema=SCHEMAS["flat"]), plain, plain.vocab_size),
    ]
    fills: list[int] = []
    real = grammar_module.fill_masks

    def counted(constraints):  # type: ignore[no-untyped-def]
        constraints = list(constraints)
        fills.append(len(constraints))
        real(constraints)

    monkeypatch.setattr(grammar_module, "fill_masks", counted)
    generator = torch.Generator().manual_seed(0)
    steps = 0
    for _ in range(12):
        live = [c for c in rows if not c.done]
        if not live:
            break
        expected = [reference_mask(c) for c in live]
        got = [c.allowed() for c in live]
        steps += 1
        assert len(fills) == steps  # one pass for every row of the step
        for c, want, have in zip(live, expected, got, strict=True):
            assert have.dtype == torch.bool and have.shape == (c.vocab,)
            assert torch.equal(have, want)
        for c, have in zip(live, got, strict=True):
            choices = torch.nonzero(have).flatten()
            token = int(choices[torch.randint(len(choices), (1,), generator=generator)])
            if token in c._special or token in c._text:
                c.done = True  # a stop: the reply ends here, not consumed
                continue
            c.consume(token)
    assert steps >= 6 and max(fills) > 1
    regex_start = Constraint(SampleConfig(regex="_?[a-c]{1,3}_?"), tok, tok.vocab_size, {underscore})
    assert not regex_start.allowed()[underscore]  # the engine allows "_" here, but the text is not whole


def test_a_row_that_allows_nothing_fails_alone():
    """Masks are computed together, but a row with no token left raises only when it asks."""
    braces = CharTokenizer.from_text("{}ab1", special_tokens=["<|endoftext|>"])
    stuck = Constraint(SampleConfig(regex="a[xy]"), braces, braces.vocab_size, {braces.eot_id})
    fine = Constraint(SampleConfig(regex="a+b"), braces, braces.vocab_size, {braces.eot_id})
    stuck.allowed()
    stuck.consume(braces.encode("a")[0])  # no "x" nor "y" in this vocabulary: nothing can follow
    fine.consume(braces.encode("a")[0])
    mask = fine.allowed()  # computes both rows' masks
    assert set(torch.nonzero(mask).flatten().tolist()) == set(braces.encode("ab"))
    with pytest.raises(GptlabError, match="regex allows no token of this vocabulary after 1 generated"):
        stuck.allowed()
    fine.consume(braces.encode("b")[0])
    assert fine.done and torch.equal(torch.nonzero(fine.allowed()).flatten(), torch.tensor([braces.eot_id]))


def test_a_mask_handed_out_stays_as_it_was_after_the_row_moves_on(tok):
    """The step reads its mask again after ``consume`` (the playground's allowed alternatives)."""
    c = Constraint(SampleConfig(json_schema=SCHEMAS["flat"]), tok, tok.vocab_size, {tok.eot_id})
    first = c.allowed()
    kept = first.clone()
    assert c.allowed() is first  # asked again at the same position: the same mask, not recomputed
    c.consume(int(torch.nonzero(first)[0]))
    second = c.allowed()
    assert torch.equal(first, kept) and not torch.equal(second, kept)


def test_waiting_rows_are_held_weakly(tok):
    """A request dropped between steps (cancelled) leaves no constraint behind on the thread."""
    c = Constraint(SampleConfig(json_schema=SCHEMAS["flat"]), tok, tok.vocab_size, {tok.eot_id})
    c.consume(int(torch.nonzero(c.allowed())[0]))
    assert id(c) in grammar_module._WAITING.rows
    ref = weakref.ref(c)
    del c
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("vocab", [79, 5000])
def test_the_mask_as_a_select_and_as_an_addition_agree(vocab, monkeypatch):
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(vocab, generator=generator) * 30
    logits[:3] = torch.tensor([torch.finfo(torch.float32).min, torch.finfo(torch.float32).max, -1e30])
    logits[3] = float("-inf")
    allowed = torch.rand(vocab, generator=generator) > 0.6
    allowed[:4] = True
    want = logits.masked_fill(~allowed, float("-inf"))
    for limit in (0, 10**9):  # always the addition, always the select
        monkeypatch.setattr(sampling, "SELECT_MAX_VOCAB", limit)
        got = apply_grammar_mask(logits, allowed)
        assert torch.equal(got, want)
        assert not bool(torch.signbit(got[allowed & (logits == 0)]).any())  # +0 added, never −0
