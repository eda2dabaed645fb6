"""The sampler inside the captured step draws from the same distribution as ``Sampler``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.generate import SampleConfig, Sampler
from gptlab.generate.sampling import draw as sampling_draw
from gptlab.generate.sampling import row_options, sample_rows, truncate, truncate_row, uniforms

V = 12


def draw(logits: torch.Tensor, config: SampleConfig, n: int) -> torch.Tensor:
    """``n`` tokens, one per row, every row a different seed."""
    t, k, p, m = row_options(config, V, 0)[:4]
    rows = lambda x, dt: torch.full((n,), x, dtype=dt)  # noqa: E731
    seeds = torch.arange(n, dtype=torch.long) * 7919 + 3
    return sample_rows(
        logits.expand(n, V),
        rows(t, torch.float32),
        rows(k, torch.long),
        rows(p, torch.float32),
        rows(m, torch.float32),
        seeds,
        torch.zeros(n, dtype=torch.long),
    )


def test_uniforms_are_in_the_open_interval_and_look_uniform():
    u = uniforms(torch.arange(64, dtype=torch.long), torch.arange(64, dtype=torch.long) * 3, 4096)
    assert u.shape == (64, 4096) and 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    again = uniforms(torch.arange(64, dtype=torch.long), torch.arange(64, dtype=torch.long) * 3, 4096)
    assert torch.equal(u, again)  # a function of (seed, position, token): no hidden state
    shifted = uniforms(torch.arange(64, dtype=torch.long), torch.arange(64, dtype=torch.long) * 3 + 1, 4096)
    assert float((u - shifted).abs().mean()) > 0.2  # the next position draws new numbers


@pytest.mark.parametrize(
    "config",
    [
        SampleConfig(temperature=1.0),
        SampleConfig(temperature=0.7, top_k=4),
        SampleConfig(temperature=1.3, top_p=0.8),
        SampleConfig(temperature=1.0, min_p=0.1, top_k=8),
    ],
    ids=["plain", "top_k", "top_p", "min_p"],
)
def test_frequencies_match_the_reference_sampler(config):
    logits = torch.linspace(-2.0, 2.0, V) ** 2 * 0.8
    expected = torch.softmax(Sampler(config, V).process(logits, []), dim=-1)
    n = 20_000
    counts = torch.bincount(draw(logits[None], config, n), minlength=V).float() / n
    assert torch.all(counts[expected == 0] == 0)  # truncated tokens are never drawn
    assert float((counts - expected).abs().max()) < 0.015


def test_greedy_rows_take_the_argmax():
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    tokens = draw(logits[:1], SampleConfig(temperature=0), 5)
    assert tokens.tolist() == [int(logits[0].argmax())] * 5


def _mix_reference(x: torch.Tensor) -> torch.Tensor:
    """The hash as the module docstring states it, one fresh tensor per operation."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    return (x >> 16) ^ x


def _uniforms_reference(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    m = 0xFFFFFFFF
    row = _mix_reference(
        _mix_reference(seed & m) ^ _mix_reference((seed >> 32) & m) ^ _mix_reference(position & m)
    )
    col = torch.arange(vocab, dtype=torch.int64) * 0x9E3779B1 & m
    bits = _mix_reference(row[:, None] ^ col[None, :]) >> 8
    return ((bits.to(torch.float32) + 0.5) / float(1 << 24)).clamp(max=1 - 2**-24)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**62 - 1),
    position=st.integers(0, 2**40),
    vocab=st.sampled_from([1, 7, 64, 1000, 49152]),
    ties=st.integers(0, 3),
)
def test_the_draw_is_the_equation_bit_for_bit(seed, position, vocab, ties):
    """``uniforms`` and ``draw`` (computed in place, one row's key as Python integers) give the bits of
    ``u = (mix(r ^ c_i) >> 8 + ½)/2²⁴`` and ``argmax(z − log(−log u))`` written out plainly, with
    tensor keys and integer keys alike, and the first of tied maxima (``Sampler``'s draw)."""
    s, p = torch.tensor([seed]), torch.tensor([position])
    expected = _uniforms_reference(s, p, vocab)
    assert torch.equal(uniforms(s, p, vocab), expected)
    assert torch.equal(uniforms(seed, position, vocab), expected)
    g = torch.Generator().manual_seed(seed % 2**31)
    z = torch.randn(1, vocab, generator=g) * 3
    winner = int(torch.argmax(z - torch.log(-torch.log(expected))))
    for i in range(ties):  # another token tied with the winner's score, before or after it
        j = (winner + 1 + i * 7) % vocab
        z[0, j] = (
            z[0, winner] - torch.log(-torch.log(expected[0, winner])) + torch.log(-torch.log(expected[0, j]))
        )
    scores = z + (-torch.log(-torch.log(expected)))
    first = int(torch.argmax(scores))
    assert int(sampling_draw(z, s, p)[0]) == first
    assert int(sampling_draw(z, seed, position)[0]) == first
    assert Sampler(SampleConfig(temperature=0), vocab).choose(scores[0]) == first


def test_rows_of_a_batch_draw_as_single_rows():
    seeds, positions = torch.tensor([3, 2**40 + 5, 99]), torch.tensor([0, 17, 2**33])
    batch = uniforms(seeds, positions, 300)
    for b in range(3):
        assert torch.equal(batch[b], uniforms(int(seeds[b]), int(positions[b]), 300)[0])


def truncations(most_k: int) -> dict[str, st.SearchStrategy]:
    """Top-k, top-p and min-p, each off (None) or on."""
    return {
        "top_k": st.one_of(st.none(), st.integers(1, most_k)),
        "top_p": st.one_of(st.none(), st.floats(0.01, 0.999)),
        "min_p": st.one_of(st.none(), st.floats(0.001, 0.5)),
    }


@settings(max_examples=300, deadline=None)
@given(
    vocab=st.sampled_from([1, 2, 5, 64, 65, 300, 5000]),
    **truncations(6000),
    spread=st.sampled_from([0.05, 1.0, 4.0, 30.0]),
    bf16=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_one_row_truncates_as_the_batched_rows_do(vocab, top_k, top_p, min_p, spread, bf16, seed):
    """``truncate_row`` (a sorted prefix: what ``Sampler`` runs) keeps exactly the tokens ``truncate``
    (the whole row sorted: what a captured step runs) keeps, ties at the threshold included (bf16
    logits tie often), for every mix of top-k, top-p and min-p, on flat and peaked rows."""
    z = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * spread
    if bf16:
        z = z.to(torch.bfloat16).float()
    z = z - z.max()
    config = SampleConfig(top_k=top_k, top_p=top_p, min_p=min_p)
    t, k, p, m = row_options(config, vocab, 0)[:4]
    expected = truncate(
        z[None], torch.tensor([k]), torch.tensor([p], dtype=torch.float32), torch.tensor([m])
    )[0]
    got = truncate_row(z, int(k), float(p), float(m))
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.equal(got[~torch.isinf(got)], z[~torch.isinf(got)])  # the kept logits are unchanged


@settings(max_examples=200, deadline=None)
@given(
    vocab=st.sampled_from([9, 64, 1000, 49152]),
    kept=st.integers(1, 200),
    seed=st.integers(0, 2**62 - 1),
    position=st.integers(0, 10_000),
    bf16=st.booleans(),
    rest=st.sampled_from([float("-inf"), -20.0, -25.0]),
)
def test_a_draw_among_the_contenders_is_the_draw_over_the_row(vocab, kept, seed, position, bf16, rest):
    """``Sampler.choose`` draws among the tokens that can win when they are few: those a truncation or a
    grammar's mask left finite, or those within ``CONTENDING`` (20.5) of the top logit (a low temperature
    puts the rest far below). The same uniforms bit for bit (``uniforms(tokens=…)``) and the same token
    as the draw over the whole row, also with the rest just inside the bound (−20) or just outside (−25)."""
    g = torch.Generator().manual_seed(seed % 2**31)
    z = torch.full((vocab,), rest) - torch.rand(vocab, generator=g) * 0.4
    tokens = torch.randperm(vocab, generator=g)[: min(kept, vocab)].sort().values
    values = torch.randn(tokens.numel(), generator=g)
    z[tokens] = values.to(torch.bfloat16).float() if bf16 else values  # ties when bf16
    z -= z.max()  # as the temperature leaves a row: its top at 0
    assert torch.equal(
        uniforms(seed, position, vocab, tokens=tokens), uniforms(seed, position, vocab)[:, tokens]
    )
    expected = int(sampling_draw(z[None], seed, position)[0])
    configs = (
        SampleConfig(seed=seed),
        SampleConfig(top_k=vocab, seed=seed),
        SampleConfig(regex="[a-z]+", seed=seed),
    )
    for config in configs:  # plain, truncated, a grammar's mask
        assert Sampler(config, vocab).choose(z, position) == expected


def test_the_top_uniform_neither_wins_every_draw_nor_passes_a_truncation():
    """Seed 7 at position 35,151 hashes token 861 to the top 24 bits, whose ``(bits + ½)/2²⁴`` rounds to
    1.0 in float32 (``−log(−log 1) = +∞``): drawn as it was, that token won whenever it was kept and, made
    −∞ by a truncation or a grammar, scored NaN and was drawn anyway. Its u stays below 1 now."""
    seed, position, token, vocab = 7, 35_151, 861, 1000
    m = 0xFFFFFFFF
    s, p = torch.tensor([seed]), torch.tensor([position])
    row = _mix_reference(_mix_reference(s & m) ^ _mix_reference((s >> 32) & m) ^ _mix_reference(p & m))
    assert int(_mix_reference(row ^ (token * 0x9E3779B1 & m)) >> 8) == (1 << 24) - 1  # the fixture holds
    u = uniforms(seed, position, vocab)
    assert float(u.max()) < 1.0 and bool(torch.isfinite(-torch.log(-torch.log(u))).all())
    z = torch.zeros(vocab)
    z[token] = float("-inf")  # truncated away: never drawn
    assert int(sampling_draw(z[None], seed, position)[0]) != token
    z = torch.zeros(vocab)
    z[token] = -30.0  # kept but improbable (e^-30): another token wins
    assert int(sampling_draw(z[None], seed, position)[0]) != token
    # 18.5 below the top and at the greatest g, it wins over the token of least g: a contender
    # (``CONTENDING``) that ``Sampler.choose``'s draw among the few must not leave out
    g = -torch.log(-torch.log(u[0]))
    least = int(g.argmin())
    z = torch.full((vocab,), float("-inf"))
    z[least], z[token] = 0.0, -18.5
    assert float(z[token] + g[token]) > float(g[least])  # the fixture holds
    assert Sampler(SampleConfig(seed=seed), vocab).choose(z, position) == token


@settings(max_examples=150, deadline=None)
@given(
    vocab=st.sampled_from([2, 65, 1000, 49152]),
    **truncations(100),
    temperature=st.sampled_from([0.3, 0.8, 1.0, 1.7]),
    masked=st.booleans(),
    seed=st.integers(0, 2**62 - 1),
)
def test_a_request_draws_what_process_then_choose_draw(vocab, top_k, top_p, min_p, temperature, masked, seed):
    """``Sampler(logits, history, allowed)`` (a truncating row drawn from its kept tokens, no −∞ row
    written) gives the token ``choose(process(…))`` gives, with penalties and a grammar's mask too."""
    g = torch.Generator().manual_seed(seed % 2**31)
    logits = torch.randn(vocab, generator=g) * 5
    history = torch.randint(0, vocab, (12,), generator=g).tolist()
    allowed = torch.rand(vocab, generator=g) < 0.3 if masked else None
    if allowed is not None:
        allowed[history[-1]] = True  # at least one token allowed
    config = SampleConfig(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=1.2, seed=seed
    )
    sampler = Sampler(config, vocab)
    expected = sampler.choose(sampler.process(logits, history, allowed), len(history) - 1)
    assert sampler(logits, history, allowed) == expected
