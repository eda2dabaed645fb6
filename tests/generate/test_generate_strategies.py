"""Decoding strategies on a model with hand-set logits, and the sampling options."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from gptlab.errors import GptlabError
from gptlab.generate import SampleConfig, Sampler, beam_search, generate_ids
from gptlab.generate.sampling import apply_penalties, min_p_filter, top_k_filter, top_p_filter
from gptlab.model import GPTConfig
from gptlab.model.positional import PositionalEncoding


class HandModel(torch.nn.Module):
    """Next-token logits = ``table[position of the last token, last token]``: a Markov chain in time."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        block, vocab, _ = table.shape
        self.config = GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_head=1, n_embd=2, pos="none")
        self.positional = PositionalEncoding(self.config)
        self.table = table
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def run(self, idx, pos=None, cache=None, attn_mask=None, last_only=False, **_):
        B, T = idx.shape
        p = pos.expand(B, T) if pos.dim() == 1 else pos
        if last_only:
            return SimpleNamespace(logits=self.table[p[:, -1], idx[:, -1]][:, None])
        return SimpleNamespace(logits=self.table[p, idx])  # (B, T, V): every position (prompt lookup)


def hand_model(vocab: int = 5, block: int = 16, seed: int = 0, scale: float = 2.0) -> HandModel:
    g = torch.Generator().manual_seed(seed)
    return HandModel(scale * torch.randn(block, vocab, vocab, generator=g))


def continuation(model: HandModel, prompt: list[int], **options) -> list[int]:
    out = generate_ids(model, torch.tensor([prompt]), options.pop("max_new_tokens", 6), **options)
    return out[0, len(prompt) :].tolist()


def test_greedy_picks_the_argmax_at_every_step():
    model = hand_model()
    prompt = [1, 2]
    got = continuation(model, prompt, temperature=0)
    seq = list(prompt)
    for token in got:
        assert token == int(model.table[len(seq) - 1, seq[-1]].argmax())
        seq.append(token)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_never_emits_outside_the_top_k(k):
    model = hand_model(vocab=8)
    for seed in range(15):
        seq = [3]
        for token in continuation(model, seq, top_k=k, seed=seed, temperature=1.5):
            allowed = torch.topk(model.table[len(seq) - 1, seq[-1]], k).indices.tolist()
            assert token in allowed
            seq.append(token)


@pytest.mark.parametrize("p", [0.3, 0.6, 0.9])
def test_top_p_never_emits_outside_the_nucleus(p):
    model = hand_model(vocab=8)
    for seed in range(15):
        seq = [0]
        for token in continuation(model, seq, top_p=p, seed=seed):
            probs = torch.softmax(model.table[len(seq) - 1, seq[-1]], -1)
            order = torch.argsort(probs, descending=True).tolist()
            mass, nucleus = 0.0, []
            for t in order:  # the smallest prefix of the sorted tokens with mass ≥ p
                nucleus.append(t)
                mass += float(probs[t])
                if mass >= p:
                    break
            assert token in nucleus
            seq.append(token)


def test_top_p_zero_keeps_the_most_probable_token_alone():
    """p = 0 (OpenAI's API and llama.cpp take it): the nucleus is the top token, so sampling at any
    temperature gives the greedy text, on the one-row sampler and on the batched one alike."""
    model = hand_model(vocab=8)
    greedy = continuation(model, [0], temperature=0, max_new_tokens=10)
    for seed in range(5):
        assert continuation(model, [0], top_p=0, temperature=2.0, seed=seed, max_new_tokens=10) == greedy
    rows = generate_ids(model, torch.tensor([[0], [0]]), 10, top_p=0, temperature=2.0, seed=3)
    assert rows[:, 1:].tolist() == [greedy, greedy]
    logits = torch.tensor([0.5, 2.0, 1.0, 2.0 - 1e-3])
    assert (top_p_filter(logits, 0.0) > float("-inf")).tolist() == [False, True, False, False]


def test_min_p_keeps_exactly_the_tokens_above_the_threshold():
    logits = torch.tensor([3.0, 2.0, 0.0, -1.0, 2.9])
    probs = torch.softmax(logits, -1)
    kept = min_p_filter(logits, 0.5) > float("-inf")
    assert kept.tolist() == (probs >= 0.5 * probs.max()).tolist()
    assert top_k_filter(logits, 2).isfinite().sum() == 2
    assert top_p_filter(logits, 1e-6).isfinite().sum() == 1  # the argmax always survives


def test_penalties_lower_seen_tokens_by_the_stated_formulas():
    logits = torch.tensor([2.0, -1.0, 0.5, 1.0])
    history = [0, 1, 1]
    rep = apply_penalties(logits, history, SampleConfig(repetition_penalty=2.0))
    assert rep.tolist() == [1.0, -2.0, 0.5, 1.0]
    freq = apply_penalties(logits, history, SampleConfig(frequency_penalty=0.5, presence_penalty=0.25))
    assert freq.tolist() == pytest.approx([2.0 - 0.5 - 0.25, -1.0 - 1.0 - 0.25, 0.5, 1.0])
    # a strong presence penalty makes greedy decoding avoid repeating itself
    model = hand_model(vocab=6, scale=0.5)
    got = continuation(model, [0], temperature=0, presence_penalty=100.0, max_new_tokens=5)
    assert len(set(got + [0])) == 6


def test_the_same_seed_gives_the_same_tokens_and_other_seeds_differ():
    model = hand_model(vocab=16, scale=0.3)
    a = continuation(model, [1], seed=7, max_new_tokens=12)
    assert a == continuation(model, [1], seed=7, max_new_tokens=12)
    assert any(continuation(model, [1], seed=s, max_new_tokens=12) != a for s in range(8, 12))


def test_sampling_follows_the_tempered_distribution():
    logits = torch.tensor([1.0, 0.0, -1.0])
    sampler = Sampler(SampleConfig(temperature=2.0, seed=0), 3)
    z = sampler.process(logits, [])
    # a draw is a function of (seed, position): 3,000 positions are 3,000 independent draws
    counts = torch.bincount(torch.tensor([sampler.choose(z, i) for i in range(3000)]), minlength=3).float()
    assert len({sampler.choose(z, 7) for _ in range(20)}) == 1  # the same position draws the same token
    expected = torch.softmax(logits / 2.0, -1) * 3000
    assert ((counts - expected).abs() < 5 * expected.sqrt()).all()


def test_stop_tokens_end_the_continuation_and_are_not_emitted():
    model = hand_model(vocab=6)
    free = continuation(model, [2], temperature=0, max_new_tokens=8)
    stop = free[3]
    cut = continuation(model, [2], temperature=0, max_new_tokens=8, stop_tokens=[stop])
    first = free.index(stop)
    assert cut[:first] == free[:first] and all(t == stop for t in cut[first:])  # padded with the stop token


# ------------------------------------------------------------------ beam search
def brute_force(
    model: HandModel, prompt: list[int], stop: int, max_new: int, alpha: float
) -> tuple[list[int], float]:
    """The best-scoring finished sequence by enumeration: Σ log p / |y|^α, |y| counting the stop token."""
    vocab = model.config.vocab_size
    best: tuple[float, list[int]] = (-math.inf, [])
    for n in range(1, max_new + 1):
        for seq in itertools.product(range(vocab), repeat=n):
            body, last = list(seq[:-1]), seq[-1]
            if stop in body or (n < max_new and last != stop):
                continue  # a sequence ends at its first stop token, or at max_new tokens
            full, logp = list(prompt), 0.0
            for t in seq:
                logp += float(torch.log_softmax(model.table[len(full) - 1, full[-1]], -1)[t])
                full.append(t)
            score = logp / n**alpha
            tokens = body if last == stop else list(seq)
            best = max(best, (score, tokens), key=lambda b: b[0])
    return best[1], best[0]


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_finds_the_brute_force_optimum(alpha, seed):
    model = hand_model(vocab=4, seed=seed, scale=1.5)
    prompt, stop, max_new = [1], 3, 4
    expected, _ = brute_force(model, prompt, stop, max_new, alpha)
    config = SampleConfig(
        max_new_tokens=max_new,
        beam_width=4**max_new,
        length_penalty=alpha,
        early_stopping=False,
        stop_tokens=[stop],
    )
    tokens, _ = beam_search(model, prompt, config)
    assert tokens == expected


def test_beam_search_can_beat_greedy_and_width_one_is_greedy():
    # step 1: token 0 looks best (0.6 vs 0.4) but leads to a flat distribution; token 1 leads to a sure thing
    table = torch.full((8, 3, 3), -30.0)
    table[0, 2] = torch.tensor([0.6, 0.4, 1e-9]).log()
    table[1, 0] = torch.tensor([0.34, 0.33, 0.33]).log()
    table[1, 1] = torch.tensor([0.999, 0.0005, 0.0005]).log()
    model = HandModel(table)
    greedy = continuation(model, [2], temperature=0, max_new_tokens=2)
    assert greedy[0] == 0
    beam, _ = beam_search(model, [2], SampleConfig(max_new_tokens=2, beam_width=2, length_penalty=0.0))
    assert beam == [1, 0]
    width_one, _ = beam_search(model, [2], SampleConfig(max_new_tokens=2, beam_width=1))
    assert width_one == greedy
    assert continuation(model, [2], beam_width=2, max_new_tokens=2)[:2] == [1, 0]  # GPT.generate path


def test_sample_config_validates_and_round_trips():
    c = SampleConfig(temperature=0.7, top_k=40, stop=["\n\n"], seed=3)
    assert SampleConfig.from_dict(c.to_dict()) == c
    for bad, match in [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=-0.1), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(beam_width=2, top_k=5), "beam search"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(stop=[""]), "stop"),
        (dict(min_p=2), "min_p"),
        (dict(stop_tokens=[-1]), "stop_tokens"),
    ]:
        with pytest.raises(GptlabError, match=match):
            SampleConfig(**bad)
    with pytest.raises(GptlabError, match="unknown sampling option"):
        SampleConfig.from_dict({"temprature": 1})
