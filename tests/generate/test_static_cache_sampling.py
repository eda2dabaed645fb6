"""The sampler inside the captured step draws from the same distribution as ``Sampler``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.generate import SampleConfig, Sampler
from gptlab.generate.sampling import (
    CANDIDATE_WIDTHS,
    CONTENDING,
    kept_tokens,
    row_options,
    sample_rows,
    truncate,
    truncate_row,
    uniforms,
)
from gptlab.generate.sampling import draw as sampling_draw

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
    # hashed on Python integers (a few tokens), it rounds and stays below 1 as the tensors do
    assert torch.equal(uniforms(seed, position, vocab, tokens=torch.tensor([token])), u[:, [token]])


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


@settings(max_examples=200, deadline=None)
@given(
    vocab=st.sampled_from([4097, 49152]),
    **truncations(300),
    temperature=st.sampled_from([0.0, 0.3, 0.8, 1.0, 1.7, 6.0]),
    shape=st.sampled_from(["spread", "narrow", "one far above", "flat", "ties"]),
    special=st.sampled_from([None, float("nan"), float("inf"), float("-inf"), -3.4028234663852886e38]),
    bf16=st.booleans(),
    seed=st.integers(0, 2**62 - 1),
)
def test_a_row_of_the_models_own_logits_draws_what_process_then_choose_draw(
    vocab, top_k, top_p, min_p, temperature, shape, special, bf16, seed
):
    """With no penalty, bias or grammar, ``Sampler`` settles a large row from the tokens that can be
    chosen (``Sampler._few``: the candidates near the top, widened until the k-th is inside): the token
    ``choose(process(…))`` gives, for greedy and any temperature, any truncation, bf16 rows and their
    ties, a row where one token stands far above the rest (its top-k reaches down past every width), a
    flat row, and rows holding NaN, ±∞ or float32's floor (the general path's to settle)."""
    g = torch.Generator().manual_seed(seed % 2**31)
    logits = torch.randn(vocab, generator=g) * {"spread": 6.0, "narrow": 0.05}.get(shape, 1.0)
    if shape == "one far above":
        logits[int(torch.randint(0, vocab, (1,), generator=g))] = 60.0
    elif shape == "flat":
        logits.fill_(2.5)
    elif shape == "ties":
        logits = (logits * 3).round()
    if special is not None:
        logits[torch.randint(0, vocab, (3,), generator=g)] = special
    if bf16:
        logits = logits.to(torch.bfloat16)
    history = torch.randint(0, vocab, (5,), generator=g).tolist()
    config = SampleConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    sampler = Sampler(config, vocab)
    expected = sampler.choose(sampler.process(logits, history), len(history) - 1)
    assert sampler(logits, history) == expected
    if not sampler.greedy:  # the tokens it draws among, and their z, are the general path's, bit for bit
        assert_near_top_is_the_general_paths(sampler, logits, history)


def assert_near_top_is_the_general_paths(sampler: Sampler, logits: torch.Tensor, history: list[int]) -> None:
    """``near_top`` is None or gives exactly the kept tokens (a truncating row) or ``choose``'s contenders
    (``CONTENDING``) of the scaled row, ascending, with their ``z`` bit for bit."""
    found = sampler.near_top(logits.float())
    if found is None:
        return
    z = sampler._scaled(logits, history, None)
    if found[0] is None:  # the whole row (where the row's −∞ stay −∞, and nan_to_num made them finite)
        finite = torch.isfinite(found[1])
        assert torch.equal(found[1][finite].view(torch.int32), z[finite].view(torch.int32))
        assert bool((z[~finite] < -1e30).all())
        return
    if sampler._truncates:
        tokens, values = kept_tokens(z, *sampler._truncation)
    else:
        tokens = (z >= z.max() - CONTENDING).nonzero()[:, 0]
        values = z[tokens]
    assert torch.equal(found[0], tokens)
    assert torch.equal(found[1].view(torch.int32), values.view(torch.int32))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_a_token_just_outside_the_candidates_that_ties_with_the_kth_is_kept(temperature):
    """``near_top`` widens while its least candidate ties with the k-th largest z: a token just below the
    candidates' bound (−5 − 1 ulp against two at −5, the top at 3) scales to the same z (−8.00000048 rounds to
    −8), so top-k keeps it too (ties stay), and it can only be found by looking wider or at the whole row."""
    vocab = 8192
    logits = torch.full((vocab,), -100.0)
    logits[10], logits[20], logits[25] = 3.0, -5.0, -5.0
    logits[30] = torch.nextafter(torch.tensor(-5.0), torch.tensor(-6.0))
    sampler = Sampler(SampleConfig(temperature=temperature, top_k=2, seed=5), vocab)
    z = sampler._scaled(logits, [], None)
    assert float(z[20]) == float(z[30]) and 3.0 - CANDIDATE_WIDTHS[0] == -5.0  # the fixture holds
    assert kept_tokens(z, *sampler._truncation)[0].tolist() == [10, 20, 25, 30]
    assert_near_top_is_the_general_paths(sampler, logits, [])
    for position in range(40):  # token 30 is drawn as often as 20 is
        assert sampler(logits, [0] * (position + 1)) == sampler.choose(sampler.process(logits, []), position)


@pytest.mark.parametrize(
    ("options", "row", "settled"),
    [
        ({"temperature": 0}, "finite", True),
        ({"temperature": 0.8}, "finite", True),
        ({"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}, "finite", True),
        ({"temperature": 0.8, "top_k": 40}, "nan", False),
        ({"temperature": 0}, "inf", False),
        ({"temperature": 0.8, "top_p": 0.9}, "finite", False),  # top-p alone needs the whole row's mass
        ({"temperature": 0.8, "top_k": 40, "repetition_penalty": 1.1}, "finite", False),
    ],
)
def test_which_rows_are_settled_from_the_tokens_near_the_top(options, row, settled):
    """``_few`` takes the rows it can settle exactly and hands back (None) the rest, so that a row it
    cannot settle never gets a token of its own."""
    vocab = 49152
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(1)) * 6
    if row != "finite":
        logits[17] = float(row)
    sampler = Sampler(SampleConfig(seed=3, **options), vocab)
    if not sampler._plain:
        assert not settled
        return
    assert (sampler._few(logits, 4) is not None) == settled
