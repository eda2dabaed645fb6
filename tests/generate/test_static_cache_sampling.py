"""The sampler inside the captured step draws from the same distribution as ``Sampler``."""

from __future__ import annotations

import pytest
import torch

from gptlab.generate import SampleConfig, Sampler
from gptlab.generate.sampling import row_options, sample_rows, uniforms

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
