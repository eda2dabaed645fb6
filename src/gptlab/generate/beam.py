"""Beam search: keep the ``b`` best partial sequences at every step (blueprint §12).

    score(y) = Σ_t log p(y_t | x, y_<t) / |y|^α          α = length_penalty

Each step extends every live beam by its most probable tokens, keeps the ``b``
best extensions, and moves extensions that end in a stop token to the finished
hypotheses (at most ``b`` kept, like Hugging Face). With ``early_stopping`` the
search ends once ``b`` hypotheses are finished; without it, it ends when no live
beam can still beat the worst finished one (the bound uses the longest possible
length for α > 0, the current one otherwise). ``|y|`` counts the generated tokens,
the stop token included. Beams live in the rows of one ``BatchSession``; after a
step, rows are copied so that row i holds beam i's parent cache. Past the context
each row's window slides like any other session row (``slide=False`` stops instead).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from gptlab.generate.config import SampleConfig
from gptlab.generate.plan import Decoder
from gptlab.generate.request import TextStream, TokenEvent, session_len, stop_token_ids, vocab_size
from gptlab.generate.sampling import Sampler
from gptlab.generate.session import BatchSession

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


def normalised(logp: float, length: int, alpha: float) -> float:
    """``logp / length^α``, computed as ``logp · exp(−α·ln length)`` with the exponent clamped to what
    a float holds, so no ``α`` divides by zero or overflows."""
    scale = min(max(-alpha * math.log(max(length, 1)), -700.0), 700.0)
    return logp * math.exp(scale)


def beam_search(
    model: Decoder,
    prompt: Sequence[int],
    config: SampleConfig,
    tokenizer: Tokenizer | None = None,
    cache_dtype: torch.dtype | None = None,
) -> tuple[list[int], str]:
    """The best continuation of ``prompt`` → ``(token ids without the stop token, finish_reason)``."""
    steps = beam_steps(model, prompt, config, tokenizer, cache_dtype)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: tuple[list[int], str] = done.value
            return result


def beam_steps(
    model: Decoder,
    prompt: Sequence[int],
    config: SampleConfig,
    tokenizer: Tokenizer | None = None,
    cache_dtype: torch.dtype | None = None,
) -> Generator[None, None, tuple[list[int], str]]:
    """``beam_search`` one batched step at a time: yields after each step, returns its result.

    A caller that interleaves beam search with other work (the server's scheduler) calls ``next``
    once per turn and stops calling to cancel.
    """
    width, alpha, limit = config.beam_width, config.length_penalty, config.max_new_tokens
    stops = stop_token_ids(config, tokenizer)
    session = BatchSession(model, width, session_len(model, [prompt], config), cache_dtype)
    slot, logits = session.add(prompt)
    prompt = list(session.tokens[slot])
    scorer = Sampler(config.replace(seed=0), vocab_size(model, tokenizer))  # penalties + temperature only
    beams: list[tuple[float, list[int], int, torch.Tensor]] = [
        (0.0, [], slot, logits)
    ]  # (Σ log p, tokens, slot, logits)
    finished: list[tuple[float, list[int], str]] = []  # min-heap of (score, tokens, reason), at most `width`
    n_cands = width + len(stops)

    def finish(score: float, tokens: list[int], reason: str) -> None:
        heapq.heappush(finished, (score, tokens, reason))
        if len(finished) > width:
            heapq.heappop(finished)

    if limit == 0:
        return [], "length"
    for step in range(1, limit + 1):
        candidates = []
        for logp_sum, tokens, b_slot, b_logits in beams:
            processed = scorer.process(b_logits, prompt + tokens)  # penalties, then /τ unless greedy
            logp = torch.log_softmax(processed, dim=-1)
            values, ids = torch.topk(logp, min(n_cands, logp.numel()))
            candidates += [
                (logp_sum + v, tokens, b_slot, t)
                for v, t in zip(values.tolist(), ids.tolist(), strict=True)
                if v != float("-inf")
            ]
        candidates.sort(key=lambda c: -c[0])
        live: list[tuple[float, list[int], int, int]] = []
        for rank, (score, tokens, parent, tok) in enumerate(candidates):
            if tok in stops:
                if rank < width:
                    finish(normalised(score, step, alpha), tokens, "stop")
            else:
                live.append((score, tokens + [tok], parent, tok))
            if len(live) == width:
                break
        if (
            not live
            or (config.early_stopping and len(finished) >= width)
            or step == limit
            or _hopeless(live, finished, width, step, limit, alpha, config.early_stopping)
        ):
            for score, tokens, _, _ in live:
                finish(normalised(score, step, alpha), tokens, "length")
            break
        if not config.slide and any(session.full(p) for _, _, p, _ in live):  # stop at the context
            for score, tokens, _, _ in live:
                finish(normalised(score, step, alpha), tokens, "context")
            break
        # row i ← parent cache of live beam i, then one batched step
        slots = list(range(len(live)))
        session.copy(slots, [p for _, _, p, _ in live])
        for s in list(session.tokens):
            if s >= len(live):
                session.remove(s)
        new_logits = session.step({i: tok for i, (_, _, _, tok) in enumerate(live)})
        yield
        beams = [(score, tokens, i, new_logits[i]) for i, (score, tokens, _, _) in enumerate(live)]
    best = max(finished, key=lambda f: f[0])
    return best[1], best[2]


def _hopeless(
    live: list[tuple[float, list[int], int, int]],
    finished: list[tuple[float, list[int], str]],
    width: int,
    step: int,
    limit: int,
    alpha: float,
    early: bool,
) -> bool:
    """True when no live beam can beat the worst kept hypothesis (log-probs only fall as beams grow)."""
    if early or len(finished) < width:
        return False
    best_live = max(score for score, *_ in live)
    length = limit if alpha > 0 else step
    return normalised(best_live, length, alpha) <= min(f[0] for f in finished)


def beam_events(
    model: Decoder,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    config: SampleConfig,
    cache_dtype: torch.dtype | None = None,
) -> Iterator[TokenEvent]:
    """Beam search over ``prompt`` (token ids, never re-encoded text) as a stream: the best
    sequence's tokens once the search is done."""
    yield from beam_stream(tokenizer, *beam_search(model, prompt, config, tokenizer, cache_dtype), config)


def beam_stream(
    tokenizer: Tokenizer, tokens: Sequence[int], reason: str, config: SampleConfig
) -> Iterator[TokenEvent]:
    """The events of a finished search's best sequence: its text, cut at a stop string."""
    text = TextStream(tokenizer, config.stop)
    for t in tokens:
        piece = text.push(t)
        yield TokenEvent(piece, t)
        if text.stopped:
            reason = "stop"
            break
    yield TokenEvent(text.finish(), None, finish_reason=reason)
