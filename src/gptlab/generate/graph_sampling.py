"""Sampling as tensor operations on a batch of rows, so it runs inside a captured decode step.

The same choices as ``Sampler`` (blueprint §12), one row per sequence, every option a tensor
``(B,)`` so that one graph serves any mix of requests:

    penalties:   l_{b,i} ← l/r_b (l > 0) or l·r_b (l ≤ 0) where c_{b,i} > 0    (repetition)
                 l_{b,i} ← l − α_f,b·c_{b,i} − α_p,b·[c_{b,i} > 0] + β_{b,i}   (frequency, presence, bias)
                 (c: the row's token counts over prompt + generated, kept in the graph's state)
    greedy:      next_b = argmax_i l_{b,i}                              (τ_b = 0)
    temperature: z_{b,i} = l_{b,i} / τ_b
    top-k:       z_{b,i} = −∞ unless z_{b,i} ≥ the k_b-th largest z_b    (k_b = V: off)
    top-p:       keep the most probable tokens until their mass reaches p_b
    min-p:       z_{b,i} = −∞ where p_{b,i} < min_p_b · max_j p_{b,j}
    draw:        next_b = argmax_i (z_{b,i} + g_{b,i}),  g = −log(−log u)   (Gumbel-max ~ softmax(z_b))

The uniform numbers come from a counter-based hash, ``u_{b,i} = h(seed_b, position_b, i)``, not
from a generator's state: a request draws the same tokens whichever rows share its batch, the
step needs no random state (CUDA graphs replay it as it is), and a seed reproduces a run.
Beam search and per-token probabilities are not here: those requests take the dynamic path
(``supports``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from gptlab.generate.config import SampleConfig

_MASK32 = 0xFFFFFFFF


#: the options the graph applies (or that act outside it: stops, text, the window); any other
#: option away from its default (penalties, logit bias, beam search, ...) means the dynamic path
IN_GRAPH = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "seed",
        "stop",
        "stop_tokens",
        "slide",
    }
)


def supports(config: SampleConfig) -> bool:
    """True when ``config`` can be sampled inside the graph: every other option is at its default."""
    default = SampleConfig()
    return all(
        getattr(config, f.name) == getattr(default, f.name)
        for f in dataclasses.fields(config)
        if f.name not in IN_GRAPH
    )


#: the per-row options, in the order ``row_options`` gives them
ROW_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "seed", "repetition", "frequency", "presence")


def row_options(config: SampleConfig, vocab: int, seed: int) -> tuple[float | int, ...]:
    """One row's ``ROW_OPTIONS``, with the "off" values filled in."""
    top_k = vocab if config.top_k is None else min(config.top_k, vocab)
    top_p = 1.0 if config.top_p is None else config.top_p
    min_p = 0.0 if config.min_p is None else config.min_p
    c = config
    return (
        float(c.temperature),
        top_k,
        top_p,
        min_p,
        seed & ((1 << 62) - 1),
        float(c.repetition_penalty),
        float(c.frequency_penalty),
        float(c.presence_penalty),
    )


def penalise(
    logits: torch.Tensor,  # (B, V) float32
    counts: torch.Tensor,  # (B, V) how often each token is in the row's history
    repetition: torch.Tensor,  # (B,) 1 = off
    frequency: torch.Tensor,  # (B,) 0 = off
    presence: torch.Tensor,  # (B,) 0 = off
    bias: torch.Tensor,  # (B, V) 0 = off
) -> torch.Tensor:
    """Repetition (CTRL), frequency and presence penalties, then the logit bias, as ``Sampler`` does.

    With the "off" values every operation leaves a logit exactly as it was (l/1, l·1, l − 0, l + 0).
    """
    present = counts > 0
    r = repetition[:, None]
    logits = torch.where(present, torch.where(logits > 0, logits / r, logits * r), logits)
    logits = logits - frequency[:, None] * counts - presence[:, None] * present.to(logits.dtype)
    return logits + bias


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply) on int64 values in [0, 2³²), without overflow."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def uniforms(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """``u_{b,i} ∈ (0, 1)`` (B, V) float32 from ``seed`` (B,) and ``position`` (B,) int64."""
    row = _mix(_mix(seed & _MASK32) ^ _mix((seed >> 32) & _MASK32) ^ _mix(position & _MASK32))  # (B,)
    col = torch.arange(vocab, device=seed.device, dtype=torch.int64) * 0x9E3779B1 & _MASK32  # (V,)
    bits = _mix(row[:, None] ^ col[None, :]) >> 8  # 24 bits: (bits + 0.5)/2²⁴ is exact in float32
    return (bits.to(torch.float32) + 0.5) / float(1 << 24)


def truncate(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Top-k, then top-p, then min-p on temperature-scaled logits ``z`` (B, V); dropped tokens → −∞."""
    ordered, _ = torch.sort(z, dim=-1, descending=True)  # (B, V)
    rank = torch.arange(z.size(-1), device=z.device)[None, :]
    ordered = ordered.masked_fill(rank >= top_k[:, None], float("-inf"))  # top-k on the sorted rows
    probs = torch.softmax(ordered, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more probable tokens
    kept = (rank < top_k[:, None]) & (before < top_p[:, None])  # the first token always stays
    last = (kept.sum(dim=-1, keepdim=True) - 1).clamp(min=0)  # (B, 1) the least probable kept token
    threshold = ordered.gather(-1, last)
    z = z.masked_fill(z < threshold, float("-inf"))
    p = torch.softmax(z, dim=-1)
    return z.masked_fill(p < min_p[:, None] * p.amax(dim=-1, keepdim=True), float("-inf"))


def sample_rows(
    logits: torch.Tensor,  # (B, V) float32
    temperature: torch.Tensor,  # (B,) 0 = greedy
    top_k: torch.Tensor,  # (B,) int64, V = off
    top_p: torch.Tensor,  # (B,) 1 = off
    min_p: torch.Tensor,  # (B,) 0 = off
    seed: torch.Tensor,  # (B,) int64
    position: torch.Tensor,  # (B,) int64, the row's position (a new number every step)
) -> torch.Tensor:
    """The next token of every row (B,) int64."""
    greedy = temperature <= 0
    z = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    z = truncate(z, top_k, top_p, min_p)
    gumbel = -torch.log(-torch.log(uniforms(seed, position, logits.size(-1))))
    drawn = torch.argmax(z + gumbel, dim=-1)
    return torch.where(greedy, torch.argmax(logits, dim=-1), drawn)


def greedy_rows(logits: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
    """``argmax_i l_{b,i}`` (B,): the cheaper graph when every row is greedy."""
    return torch.argmax(logits, dim=-1)


#: the sampler a captured step uses, by flavour (every row greedy, or any mix)
ROW_SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {"greedy": greedy_rows, "sample": sample_rows}
