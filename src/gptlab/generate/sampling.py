"""From next-token logits to a token (blueprint §12, "Output Generation").

    penalties:   l_i ← l_i / r  (l_i > 0) or l_i·r (l_i ≤ 0) for every token i seen (repetition, CTRL)
                 l_i ← l_i − α_f·count_i − α_p·[count_i > 0]   (frequency and presence)
    logit bias:  l_i ← l_i + b_i                                  (OpenAI's logit_bias)
    grammar:     l_i ← −∞ for every token i the grammar does not allow here   (structured output)
    temperature: p_i = exp(l_i/τ) / Σ_j exp(l_j/τ)
    greedy:      next = argmax_i p_i                            (τ = 0)
    top-k:       keep the k most probable tokens, renormalise
    top-p:       keep the smallest set whose probabilities sum to ≥ p (the nucleus)
    min-p:       keep tokens with p_i ≥ min_p · max_j p_j
    sample:      next ~ Categorical(p)

Extreme options cannot poison a draw: ``l − max l`` is divided by τ (the same softmax, no overflow);
a τ too small for float32 is greedy; top-p always keeps the most probable token; a row left with
no finite logit, or with NaN, falls back to ``argmax`` of the finite logits; any integer seed is
taken modulo 2⁶⁴ (what ``torch.Generator`` accepts).

Each step is one small function; ``Sampler`` applies them in that order with its
own ``torch.Generator``, so a seed makes a request reproducible on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gptlab.generate.config import SampleConfig


def apply_penalties(logits: torch.Tensor, history: Sequence[int], config: SampleConfig) -> torch.Tensor:
    """Repetition (CTRL), frequency and presence penalties over the tokens in ``history``."""
    if not history or (
        config.repetition_penalty == 1.0
        and config.frequency_penalty == 0.0
        and config.presence_penalty == 0.0
    ):
        return logits
    seen = torch.tensor(list(history), dtype=torch.long, device=logits.device)
    seen = seen[seen < logits.numel()]
    counts = torch.bincount(seen, minlength=logits.numel()).to(logits.dtype)  # (vocab,)
    present = counts > 0
    logits = logits.clone()
    if config.repetition_penalty != 1.0:
        r = config.repetition_penalty
        logits = torch.where(present, torch.where(logits > 0, logits / r, logits * r), logits)
    if config.frequency_penalty or config.presence_penalty:
        logits = (
            logits - config.frequency_penalty * counts - config.presence_penalty * present.to(logits.dtype)
        )
    return logits


def apply_logit_bias(logits: torch.Tensor, bias: dict[int, float]) -> torch.Tensor:
    """``l_i + b_i`` for every token ``i`` in ``bias`` (ids outside the logits are ignored)."""
    if not bias:
        return logits
    ids = [i for i in bias if i < logits.numel()]
    index = torch.tensor(ids, dtype=torch.long, device=logits.device)
    values = torch.tensor([float(bias[i]) for i in ids], dtype=logits.dtype, device=logits.device)
    return logits.index_add(0, index, values)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep exactly the ``k`` largest logits (ties broken by ``topk``); the rest become −∞."""
    if k >= logits.numel():
        return logits
    keep = torch.topk(logits, k).indices
    return torch.full_like(logits, float("-inf")).scatter(0, keep, logits[keep])


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most probable tokens whose probabilities sum to ≥ ``p``."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more probable tokens
    drop_sorted = before >= p
    drop_sorted[0] = False  # the most probable token always stays (p may round to 0 in float32)
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens with ``p_i ≥ min_p · max_j p_j`` (i.e. ``l_i ≥ max l + log min_p``)."""
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


class Sampler:
    """One request's logit processing and sampling, with its own ``torch.Generator``.

    ``sampler(logits (vocab,), history) -> token id``. Logits beyond ``vocab_size``
    (a padded embedding) are never chosen. With ``seed=None`` the generator is seeded
    from torch's global generator, so ``torch.manual_seed`` still makes runs repeatable.
    """

    def __init__(self, config: SampleConfig, vocab_size: int) -> None:
        self.config = config
        self.vocab_size = vocab_size
        # a temperature that float32 cannot divide by is the limit τ → 0: greedy
        self.greedy = config.greedy or float(torch.tensor(config.temperature, dtype=torch.float32)) == 0.0
        seed = config.seed if config.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        self.generator = torch.Generator().manual_seed(seed % 2**64)  # negative seeds: same as torch's

    def process(
        self, logits: torch.Tensor, history: Sequence[int], allowed: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Penalised, biased, temperature-scaled, truncated logits (vocab,), float32 on the CPU.

        ``allowed`` (bool, vocab): the tokens a grammar allows; the others are −∞ before the
        temperature and the truncations, so that top-k/top-p/min-p choose among allowed tokens only.
        """
        c = self.config
        logits = logits[: self.vocab_size].float().cpu()
        logits = apply_logit_bias(apply_penalties(logits, history, c), c.logit_bias)
        logits = torch.nan_to_num(logits, nan=float("-inf"), posinf=torch.finfo(logits.dtype).max)
        if allowed is not None:
            logits = logits.masked_fill(~allowed[: logits.numel()], float("-inf"))
        if self.greedy:
            return logits
        if c.temperature != 1.0:
            logits = (logits - logits.max()) / c.temperature  # ≤ 0: never overflows to +inf
        if c.top_k is not None:
            logits = top_k_filter(logits, c.top_k)
        if c.top_p is not None:
            logits = top_p_filter(logits, c.top_p)
        if c.min_p is not None:
            logits = min_p_filter(logits, c.min_p)
        return logits

    def choose(self, logits: torch.Tensor) -> int:
        """Argmax when greedy, else a draw from ``softmax(logits)``; argmax when no draw is possible."""
        if self.greedy:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(logits, dim=-1)
        try:  # torch checks the distribution itself (NaN, inf, a zero sum): no extra pass per token
            return int(torch.multinomial(probs, 1, generator=self.generator).item())
        except RuntimeError:  # no draw is possible (every logit −inf after the filters): the argmax
            return int(torch.argmax(torch.nan_to_num(logits, nan=float("-inf"))).item())

    def __call__(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        return self.choose(self.process(logits, history))
