"""From next-token logits to a token (blueprint §12, "Output Generation"): one sampler for every engine.

Every step is a tensor operation on a batch of rows ``(B, V)``, each option a per-row tensor
``(B,)``, so the same functions run for one request (``Sampler``: B = 1) and inside a captured
decode step (``StaticSession``: every row of a batch, any mix of options):

    penalties:   l_{b,i} ← l/r_b (l > 0) or l·r_b (l ≤ 0) where c_{b,i} > 0      (repetition, CTRL)
                 l_{b,i} ← l − α_f,b·c_{b,i} − α_p,b·[c_{b,i} > 0] + β_{b,i}     (frequency, presence, bias)
                 (c: the row's token counts over prompt + generated; β: OpenAI's logit_bias)
    grammar:     l_{b,i} ← −∞ for every token i the grammar does not allow here   (structured output)
    greedy:      next_b = argmax_i l_{b,i}                                       (τ_b = 0)
    temperature: z_{b,i} = (l_{b,i} − max_j l_{b,j}) / τ_b                        (≤ 0: never overflows)
    top-k:       z_{b,i} = −∞ unless z_{b,i} ≥ the k_b-th largest z_b            (k_b = V: off)
    top-p:       keep the most probable tokens until their mass reaches p_b     (p_b = 1: off)
    min-p:       z_{b,i} = −∞ where p_{b,i} < min_p_b · max_j p_{b,j}
    draw:        next_b = argmax_i (z_{b,i} + g_{b,i}),  g = −log(−log u)        (Gumbel-max ~ softmax(z_b))

The uniform numbers come from a counter-based hash, ``u_{b,i} = h(seed_b, position_b, i)``, where
``position_b`` is the position of the row's last token (prompt + generated − 1), not from a
generator's state. So **a seed means the same tokens on every engine**: eager or compiled, the
dynamic or the static cache, one row or a batch (row b of a batch is a single run with its seed),
and a captured CUDA graph replays its draws with no random state inside.

One request's row (``Sampler``) computes the same tokens with less work: its truncation reads only
the sorted prefix that holds the kept tokens (``truncate_row``; the batched ``truncate`` sorts every
row, as a graph of fixed shapes must), and a row in which few tokens can win (a truncation or a
grammar left few finite, or a low temperature put most far below the top: ``CONTENDING``) is hashed
and drawn among those alone (``draw(..., tokens=…)``: each token's u is the same number either way).
A row of the model's own finite logits (no penalty, bias or grammar) is settled from the tokens near
its top (``Sampler.near_top``): only those are scaled and truncated, the rest provably out of reach.

Extreme options cannot poison a draw: a τ too small for float32 is greedy; top-p always keeps the
most probable token; a row left with no finite logit, or with NaN, falls back to ``argmax`` of the
finite logits; any integer seed is taken modulo 2⁶² (``Sampler.seed``); u stays below 1 (``BELOW_ONE``),
so no token's g is +∞.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from gptlab.generate.config import SampleConfig

_MASK32 = 0xFFFFFFFF
SEED_BITS = 62

#: the options the graph applies (or that act outside it: stops, text, the window); any other
#: option away from its default (beam search, a grammar, ...) means the dynamic path
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
        "prompt_lookup",  # the plan leaves it out of a static decode: it changes passes, never tokens
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
        seed % (1 << SEED_BITS),
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
    """Repetition (CTRL), frequency and presence penalties, then the logit bias.

    With the "off" values every operation leaves a logit exactly as it was (l/1, l·1, l − 0, l + 0).
    """
    present = counts > 0
    r = repetition[:, None]
    logits = torch.where(present, torch.where(logits > 0, logits / r, logits * r), logits)
    logits = logits - frequency[:, None] * counts - presence[:, None] * present.to(logits.dtype)
    return logits + bias


_MIX = 0x45D9F3B

#: a row's seed and position: (B,) int64 tensors, or one row's Python integers (``Sampler``)
Key = torch.Tensor | int


def _mix(x: Key) -> Key:
    """A 32-bit integer hash (xor-shift-multiply) on values in [0, 2³²), without overflow: int64
    tensors or Python integers, the same numbers."""
    x = ((x >> 16) ^ x) * _MIX & _MASK32
    x = ((x >> 16) ^ x) * _MIX & _MASK32
    return (x >> 16) ^ x


def _columns(vocab: int, device: torch.device) -> torch.Tensor:
    """``c_i = i·0x9E3779B1 mod 2³²`` (V,) int64."""
    return _hashed(torch.arange(vocab, device=device, dtype=torch.int64))


def _hashed(tokens: torch.Tensor) -> torch.Tensor:
    return tokens * 0x9E3779B1 & _MASK32


_kept_columns = functools.cache(_columns)  # the same for every draw: made once a vocabulary and device


def _bits(seed: Key, position: Key, col: torch.Tensor) -> torch.Tensor:
    """``h(seed_b, position_b, i) >> 8`` (B, n) int64, 24 bits, for the tokens whose ``c_i`` are ``col``
    (1, n): ``r_b = mix(mix(seed mod 2³²) ^ mix(seed >> 32) ^ mix(position mod 2³²))``, then
    ``mix(r_b ^ c_i)``. One row's ``r`` is computed on Python integers; the mix over the tokens runs
    in place in one int64 tensor and one scratch tensor (a fresh tensor per operation took 0.37 ms a
    draw at 49,152 tokens, against 0.27)."""
    row = _mix(_mix(seed & _MASK32) ^ _mix((seed >> 32) & _MASK32) ^ _mix(position & _MASK32))
    x = col ^ (row[:, None] if isinstance(row, torch.Tensor) else row)  # (B, n), a tensor of its own
    scratch = torch.empty_like(x)
    for _ in range(2):
        x ^= torch.bitwise_right_shift(x, 16, out=scratch)
        x *= _MIX
        x &= _MASK32
    x ^= torch.bitwise_right_shift(x, 16, out=scratch)
    x >>= 8
    return x


def uniforms(
    seed: Key,
    position: Key,
    vocab: int,
    device: torch.device | None = None,
    tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``u_{b,i} = (bits + ½)/2²⁴ ∈ (0, 1)`` (B, V) float32 (rounded to float32) from ``seed`` and
    ``position`` ((B,) int64, or one row's integers: B = 1, on ``device``); (B, n) for the token ids
    ``tokens`` (n,) alone, each the number it has in the whole row. The top value is ``BELOW_ONE``."""
    dev = seed.device if isinstance(seed, torch.Tensor) else torch.device(device or "cpu")
    if (
        tokens is not None
        and tokens.numel() <= FEW_TOKENS
        and isinstance(seed, int)
        and isinstance(position, int)
    ):
        return _few_uniforms(seed, position, tokens.tolist(), dev)
    if tokens is not None:
        col = _hashed(tokens)
    else:
        kept = dev.type == "cpu" and not torch.compiler.is_compiling()  # not inside a captured graph
        col = (_kept_columns if kept else _columns)(vocab, dev)
    u = _bits(seed, position, col[None, :]).to(torch.float32)
    u += 0.5
    u /= float(1 << 24)
    return u.clamp_(max=BELOW_ONE)


#: up to this many tokens one row's u are hashed on Python integers (a few µs) rather than in ~20 tensor
#: operations (each some µs on a CPU whose caches a decode step has just flushed)
FEW_TOKENS = 64


def _few_uniforms(seed: int, position: int, tokens: list[int], device: torch.device) -> torch.Tensor:
    """``uniforms(seed, position, …, tokens)`` (1, n) on Python integers: the same hash, and the same
    float32 (``(bits + ½)/2²⁴`` is exact in a double and rounds to float32 once, as the tensor's sum
    does; the division by 2²⁴ is exact in both)."""
    row = _mix(_mix(seed & _MASK32) ^ _mix((seed >> 32) & _MASK32) ^ _mix(position & _MASK32))
    assert isinstance(row, int)
    out = []
    for t in tokens:
        x = ((t * 0x9E3779B1) & _MASK32) ^ row
        x = ((x >> 16) ^ x) * _MIX & _MASK32
        x = ((x >> 16) ^ x) * _MIX & _MASK32
        out.append((((x >> 16) ^ x) >> 8) + 0.5)
    u = torch.tensor([out], dtype=torch.float32, device=device)
    return u.div_(float(1 << 24)).clamp_(max=BELOW_ONE)


#: the largest float32 below 1. ``(bits + ½)/2²⁴`` for the top bits, ``1 − 2⁻²⁵``, rounds to 1.0 in float32
#: (ties to even), where ``g = −log(−log u)`` is +∞: that token then won every draw it was kept in, and
#: one truncation or a grammar had removed scored ``−∞ + ∞ = NaN``, which ``argmax`` takes for the
#: maximum, so it was drawn (0.3 % of draws over 49,152 tokens meet such a u). Clamped, u < 1.
BELOW_ONE = 1.0 - 2.0**-24


def scale(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``z = (l − max l)/τ`` per row (B, V) (a greedy row, τ = 0, is divided by 1)."""
    greedy = temperature <= 0
    top = logits.amax(dim=-1, keepdim=True).clamp(min=torch.finfo(logits.dtype).min)  # a row of −∞ stays so
    return (logits - top) / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]


def truncate(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Top-k, then top-p, then min-p on temperature-scaled logits ``z`` (B, V); dropped tokens → −∞."""
    ordered, _ = torch.sort(z, dim=-1, descending=True)  # (B, V)
    rank = torch.arange(z.size(-1), device=z.device)[None, :]
    ordered = ordered.masked_fill(rank >= top_k[:, None], float("-inf"))  # top-k on the sorted rows
    probs = torch.softmax(ordered, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly more probable tokens
    nucleus = (before < top_p[:, None]) | (top_p[:, None] >= 1)  # p = 1 keeps all (cumsum may round to 1)
    kept = (rank < top_k[:, None]) & nucleus  # the first token always stays
    last = (kept.sum(dim=-1, keepdim=True) - 1).clamp(min=0)  # (B, 1) the least probable kept token
    threshold = ordered.gather(-1, last)
    return _min_p(z.masked_fill(z < threshold, float("-inf")), min_p)


def _min_p(z: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Min-p on (B, V): ``z_i = −∞`` where ``p_i < min_p · max_j p_j``, ``p = softmax(z)``."""
    p = torch.softmax(z, dim=-1)
    return z.masked_fill(p < min_p[:, None] * p.amax(dim=-1, keepdim=True), float("-inf"))


#: the first sorted prefix ``truncate_row`` reads for top-p; it reads 8× more until the nucleus ends in it
NUCLEUS_PREFIX = 64


def truncate_row(z: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """``truncate`` of one row ``z`` (V,): the same kept tokens (``kept_tokens``), the rest −∞."""
    if top_k >= z.numel() and top_p >= 1.0 and min_p <= 0.0:
        return z
    tokens, values = kept_tokens(z, top_k, top_p, min_p)
    return torch.full_like(z, float("-inf")).index_put_((tokens,), values)


def kept_tokens(z: torch.Tensor, top_k: int, top_p: float, min_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens ``truncate`` keeps of one row ``z`` (V,), ascending, and their ``z``, found from the
    sorted prefix they need rather than the whole sorted row (sorting 49,152 logits took 2.8 ms of a
    3.5 ms truncation on a CPU); what follows the truncation then works on those few.

    Top-k's threshold is the k-th largest ``z`` (``topk``). Top-p's is the least probable token whose
    mass before it, ``Σ_{j<r} p_j``, is below ``p``, with ``p = softmax`` over the top k (or every
    token): that mass grows with the rank r, so a prefix of the sorted row in which it reaches ``p``
    holds the whole nucleus (read 64, then 8× more until it does). Ties with the threshold stay, as
    in ``truncate``. Min-p drops ``p_i < min_p · max_j p_j``, ``p`` the softmax over the kept tokens
    (the row's, with the dropped ones at −∞).
    """
    v = z.numel()
    threshold = None
    if top_p < 1.0:
        p = _float32(top_p)
        if top_k < v:  # top-k first: the nucleus is among the k, their softmax renormalised
            threshold = _nucleus_end(z.topk(top_k).values, p)
        else:
            high = z.max()
            mass = torch.exp(z - high).sum()
            n = NUCLEUS_PREFIX
            while True:
                top = z.topk(min(n, v)).values
                probs = torch.exp(top - high) / mass
                before = torch.cumsum(probs, dim=-1) - probs
                kept = int((before < p).sum())
                if kept < top.numel() or top.numel() == v:
                    threshold = top[max(kept - 1, 0)]
                    break
                n *= 8
    elif top_k < v:
        threshold = z.topk(top_k).values[-1]
    tokens = (z > float("-inf") if threshold is None else ~(z < threshold)).nonzero()[:, 0]
    return _min_p_kept(tokens, z[tokens], min_p)


def _float32(x: float) -> float:
    """``x`` rounded to float32 (as the batched rows compare top-p)."""
    return float(torch.tensor(x, dtype=torch.float32))


def _nucleus_end(top: torch.Tensor, p: float) -> torch.Tensor:
    """Top-p's threshold among the sorted values ``top``, over their own softmax: the least probable
    token whose mass before it is below ``p`` (the first always stays)."""
    probs = torch.softmax(top, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    return top[max(int((before < p).sum()) - 1, 0)]


def _min_p_kept(
    tokens: torch.Tensor, values: torch.Tensor, min_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Min-p on kept ``tokens`` and their ``values``: drop ``p_i < min_p · max_j p_j``, ``p`` their softmax."""
    if min_p > 0:
        p_kept = torch.softmax(values, dim=-1)
        stay = ~(p_kept < min_p * p_kept.max())
        tokens, values = tokens[stay], values[stay]
    return tokens, values


def draw(z: torch.Tensor, seed: Key, position: Key, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """``argmax_i (z_{b,i} + g_{b,i})`` (B,): a draw from ``softmax(z_b)`` (Gumbel-max), with
    ``g = −log(−log u)`` computed in place over ``u`` (the same operations in the same order, so the
    same bits), and the first maximum's index (``max``'s, as ``argmax``'s, 3× faster on a CPU row).
    With ``tokens`` (n,) ascending, ``z`` (B, n) holds those tokens' logits: the index among them."""
    g = uniforms(seed, position, z.size(-1), z.device, tokens).log_().neg_().log_().neg_()
    return g.add_(z).max(dim=-1).indices


#: from this many tokens a greedy row takes ``max``'s index (3× faster than ``argmax`` at 49,152; slower
#: for a few dozen, ~1 µs)
MAX_OVER_ARGMAX = 4096
#: a row in which at most this share of the tokens can win draws among those alone (``Sampler.choose``)
DRAW_AMONG_KEPT = 1 / 8
#: how far below the row's top logit a token can still win: ``g = −log(−log u)`` lies between
#: ``g(2⁻²⁵) = −2.85`` (the least u) and ``g(BELOW_ONE) = 16.64``, so a token more than their difference
#: below the top scores less than the top token's least score (1 more for float32's roundings)
CONTENDING = -math.log(-math.log(BELOW_ONE)) + math.log(-math.log(2.0**-25)) + 1.0


def sample_rows(
    logits: torch.Tensor,  # (B, V) float32, penalised
    temperature: torch.Tensor,  # (B,) 0 = greedy
    top_k: torch.Tensor,  # (B,) int64, V = off
    top_p: torch.Tensor,  # (B,) 1 = off
    min_p: torch.Tensor,  # (B,) 0 = off
    seed: torch.Tensor,  # (B,) int64
    position: torch.Tensor,  # (B,) int64, the position of the row's last token
) -> torch.Tensor:
    """The next token of every row (B,) int64."""
    greedy = temperature <= 0
    drawn = draw(truncate(scale(logits, temperature), top_k, top_p, min_p), seed, position)
    return torch.where(greedy, torch.argmax(logits, dim=-1), drawn)


def greedy_rows(logits: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
    """``argmax_i l_{b,i}`` (B,): the cheaper graph when every row is greedy."""
    return torch.argmax(logits, dim=-1)


#: the sampler a captured step uses, by flavour (every row greedy, or any mix)
ROW_SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {"greedy": greedy_rows, "sample": sample_rows}


# ------------------------------------------------------------------ one row
def token_counts(history: Sequence[int], vocab: int) -> torch.Tensor:
    """``c_i``: how often token ``i`` occurs in ``history`` (vocab,) float32 (ids past ``vocab`` ignored)."""
    seen = torch.tensor(list(history), dtype=torch.long)
    return torch.bincount(seen[seen < vocab], minlength=vocab).to(torch.float32)


def _row(x: float | int, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([x], dtype=dtype)


def apply_penalties(logits: torch.Tensor, history: Sequence[int], config: SampleConfig) -> torch.Tensor:
    """One row's repetition, frequency and presence penalties over ``history`` (``penalise``)."""
    if not history or (
        config.repetition_penalty == 1.0
        and config.frequency_penalty == 0.0
        and config.presence_penalty == 0.0
    ):
        return logits
    counts = token_counts(history, logits.numel()).to(logits.dtype)
    options = (config.repetition_penalty, config.frequency_penalty, config.presence_penalty)
    r, f, p = (_row(x, logits.dtype) for x in options)
    return penalise(logits[None], counts[None], r, f, p, torch.zeros_like(logits)[None])[0]


def apply_logit_bias(logits: torch.Tensor, bias: dict[int, float]) -> torch.Tensor:
    """``l_i + b_i`` for every token ``i`` in ``bias`` (ids outside the logits are ignored)."""
    if not bias:
        return logits
    ids = [i for i in bias if i < logits.numel()]
    index = torch.tensor(ids, dtype=torch.long, device=logits.device)
    values = torch.tensor([float(bias[i]) for i in ids], dtype=logits.dtype, device=logits.device)
    return logits.index_add(0, index, values)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits (and any tied with the k-th); the rest become −∞."""
    return logits if k >= logits.numel() else truncate_row(logits, k, 1.0, 0.0)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most probable tokens whose probabilities sum to ≥ ``p``."""
    return logits if p >= 1.0 else truncate_row(logits, logits.numel(), p, 0.0)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens with ``p_i ≥ min_p · max_j p_j``."""
    return logits if min_p <= 0.0 else truncate_row(logits, logits.numel(), 1.0, min_p)


#: up to this many tokens a grammar's mask is applied as a select, above it as an addition
#: (``apply_grammar_mask``)
SELECT_MAX_VOCAB = 1024
#: −∞ as float32 bits (0xFF800000), as a signed 32-bit integer
_NEG_INF_BITS = -(1 << 23)


def apply_grammar_mask(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``l_i`` where ``allowed_i``, −∞ elsewhere (``logits`` float32 (V,) on the CPU, ``allowed`` bool (V,)).

    A select branches on every token, and a grammar's mask over a large vocabulary is close to random
    (about 40× slower than an addition at 49,152 tokens): there the mask is added as a float,
    ``l_i + m_i`` with ``m_i`` = +0 or −∞ built from the bits, ``bits(m_i) = (allowed_i − 1) & bits(−∞)``
    (−1 & bits(−∞) = bits(−∞), 0 & bits(−∞) = +0); l is never +∞ here, so the sum is exact.
    """
    if logits.numel() <= SELECT_MAX_VOCAB:
        return torch.where(allowed, logits, float("-inf"))
    bits = (allowed.numpy().astype(np.int32) - 1) & np.int32(_NEG_INF_BITS)
    return logits + torch.from_numpy(bits.view(np.float32))


#: how far below a row's top logit ``Sampler`` first looks for its top-k tokens, in logits, then wider
#: (a token that far below is rarely among a request's k; where one is, the next width, then the whole row)
CANDIDATE_WIDTHS = (8.0, 32.0)
_FLOAT32_MIN = torch.finfo(torch.float32).min


class Sampler:
    """One request's logit processing and draw: the functions above on one row.

    ``sampler(logits (vocab,), history) -> token id``. Logits beyond ``vocab_size`` (a padded
    embedding) are never chosen. ``seed`` is the request's (``seed=None``: one drawn from torch's
    global generator, so ``torch.manual_seed`` still makes runs repeatable); the static path seeds
    the row inside its graph with the same number, and both draw ``h(seed, position, i)``.
    """

    def __init__(self, config: SampleConfig, vocab_size: int) -> None:
        self.config = config
        self.vocab_size = vocab_size
        # a temperature that float32 cannot divide by is the limit τ → 0: greedy
        self.greedy = config.greedy or float(torch.tensor(config.temperature, dtype=torch.float32)) == 0.0
        seed = config.seed if config.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        self.seed = seed % (1 << SEED_BITS)  # negative seeds too
        t, k, p, m = row_options(config, vocab_size, self.seed)[:4]
        self._temperature = _row(t, torch.float32)
        self._truncation = (int(k), float(p), float(m))
        self._tau, self._top_p32 = float(self._temperature), _float32(float(p))  # as the tensors hold them
        self._truncates = config.top_k is not None or config.top_p is not None or config.min_p is not None
        #: no penalty and no bias: the logits are the model's, as they come (``_few``)
        penalties = (config.repetition_penalty, config.frequency_penalty, config.presence_penalty)
        self._plain = not config.logit_bias and penalties == (1.0, 0.0, 0.0)

    def process(
        self, logits: torch.Tensor, history: Sequence[int], allowed: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Penalised, biased, masked, temperature-scaled, truncated logits (vocab,), float32 on the CPU.

        ``allowed`` (bool, vocab): the tokens a grammar allows; the others are −∞ before the
        temperature and the truncations, so that top-k/top-p/min-p choose among allowed tokens only.
        """
        z = self._scaled(logits, history, allowed)
        return truncate_row(z, *self._truncation) if self._truncates else z

    def _scaled(
        self, logits: torch.Tensor, history: Sequence[int], allowed: torch.Tensor | None
    ) -> torch.Tensor:
        """``process`` up to the truncations: penalised, biased, masked and (unless greedy) divided by τ."""
        c = self.config
        logits = logits[: self.vocab_size].float().cpu()
        logits = apply_logit_bias(apply_penalties(logits, history, c), c.logit_bias)
        logits = torch.nan_to_num(logits, nan=float("-inf"), posinf=torch.finfo(logits.dtype).max)
        if allowed is not None:
            logits = apply_grammar_mask(logits, allowed[: logits.numel()])
        return logits if self.greedy else scale(logits[None], self._temperature)[0]

    def choose(self, logits: torch.Tensor, position: int = 0) -> int:
        """Argmax when greedy, else the draw ``argmax_i(z_i + g_i)`` with ``u = h(seed, position, i)``;
        the argmax of the finite logits when no draw is possible (every logit −inf or NaN). Where few
        tokens can win (``CONTENDING``: within 20.5 of the top logit; a truncation or a grammar leaves
        the rest at −∞, and a low temperature spreads the row), it hashes and draws among those alone:
        the same token."""
        if self.greedy:  # the first maximum: max's index is argmax's, and 3× faster over 49,152 tokens
            return int(logits.max(dim=0).indices if logits.numel() > MAX_OVER_ARGMAX else logits.argmax())
        top = logits.max()
        if not bool(top > float("-inf")):
            return int(torch.argmax(torch.nan_to_num(logits, nan=float("-inf"))).item())
        contenders = logits >= top - CONTENDING  # the only tokens that can win (−∞ never does)
        if int(contenders.sum()) <= DRAW_AMONG_KEPT * logits.numel():
            kept = contenders.nonzero()[:, 0]  # ascending: the first maximum stays first
            return int(kept[draw(logits[kept][None], self.seed, position, kept)[0]])
        return int(draw(logits[None], self.seed, position)[0])

    def __call__(
        self, logits: torch.Tensor, history: Sequence[int], allowed: torch.Tensor | None = None
    ) -> int:
        """``choose(process(logits, history, allowed), position)``: the same token. A truncating row
        draws among ``kept_tokens`` straight away: no −∞ row is written and read again; a row of the
        model's own finite logits (``_few``) is scaled only where a token can be chosen."""
        position = max(len(history) - 1, 0)
        if self._plain and allowed is None and logits.device.type == "cpu":
            token = self._few(
                logits if logits.numel() == self.vocab_size else logits[: self.vocab_size], position
            )
            if token is not None:
                return token
        if self.greedy or not self._truncates:
            return self.choose(self.process(logits, history, allowed), position)
        z = self._scaled(logits, history, allowed)
        tokens, values = kept_tokens(z, *self._truncation)
        if not bool(values.max() > float("-inf")):  # no draw is possible: choose's fallback
            return self.choose(truncate_row(z, *self._truncation), position)
        return int(tokens[draw(values[None], self.seed, position, tokens)[0]])

    def _few(self, logits: torch.Tensor, position: int) -> int | None:
        """``__call__``'s token for a row of the model's own logits (V,) (no penalty, bias or grammar), in a
        handful of operations over the row rather than ~15; None where the general path must decide (a
        small row, a non-finite one, top-p or min-p without top-k).

        Greedy: numpy's ``argmax`` (the first maximum, as ``max``'s index, ~10× faster; a NaN would win
        it, and ``nan_to_num`` leaves a finite maximum first). Otherwise the draw among ``near_top``."""
        if logits.numel() <= MAX_OVER_ARGMAX or logits.requires_grad:
            return None
        if logits.dtype != torch.float32:
            logits = logits.float()  # exact, as process's
        if self.greedy:
            row = logits.numpy()
            best = int(row.argmax())
            return best if _FLOAT32_MIN < float(row[best]) < math.inf else None
        found = self.near_top(logits)
        if found is None:
            return None
        tokens, values = found
        if tokens is None:  # many can win: the whole row's draw, as choose's
            return int(draw(values[None], self.seed, position)[0])
        return int(tokens[draw(values[None], self.seed, position, tokens)[0]])

    def near_top(self, logits: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """The tokens a sampled row (float32 (V,), no penalty, bias or grammar) can draw, ascending, and
        their ``z``: ``kept_tokens`` of the scaled row when it truncates, else ``choose``'s contenders
        (``z_i ≥ −CONTENDING``), or, when more than ``DRAW_AMONG_KEPT`` of the row may contend, (None,
        the whole row's z) (a −∞ logit stays −∞ there, which wins no draw either way); None where that
        cannot be settled from the tokens near the top.

        Only the candidates ``c = {i : l_i ≥ max l − w}`` are scaled, ``z_c = (l_c − max l)/τ`` (``scale``'s
        operations on those elements: the same numbers), and the rest follows on them:

        * no truncation: the contenders, all within ``w = CONTENDING·τ`` plus a margin for rounding;
        * top-k (then top-p, min-p): ``w`` from ``CANDIDATE_WIDTHS`` until a candidate's z is below the
          k-th largest. z is monotone in l, so every token outside scores below it too, and the kept
          tokens and the k largest values top-p reads are all candidates.
        """
        top_k, top_p, min_p = self._truncation
        if self._truncates and top_k >= self.vocab_size:
            return None
        top = logits.max()
        high = float(top)
        if not _FLOAT32_MIN < high < math.inf:  # NaN, ±∞ or the float32 floor: nan_to_num has work to do
            return None
        widths = (
            CANDIDATE_WIDTHS
            if self._truncates
            else (CONTENDING * self._tau * 1.001 + 1e-3 * (1.0 + abs(high)),)
        )
        for width in widths:
            candidates = (logits >= high - width).nonzero()[:, 0]
            if not self._truncates and candidates.numel() > DRAW_AMONG_KEPT * logits.numel():
                return None, (logits - top) / self._temperature
            z = (logits[candidates] - top) / self._temperature
            if not self._truncates:
                keep = z >= -CONTENDING  # the top scales to 0
                return candidates[keep], z[keep]
            if candidates.numel() > top_k:
                largest = z.topk(top_k).values
                if bool(z.min() < largest[-1]):  # else a token outside may tie with the k-th: wider
                    threshold = _nucleus_end(largest, self._top_p32) if top_p < 1.0 else largest[-1]
                    keep = ~(z < threshold)
                    return _min_p_kept(candidates[keep], z[keep], min_p)
        return None
