"""The decoding core: one loop that drives a ``BatchSession`` for any number of requests.

    prefill(prompt) → logits → token → step(token) → logits → …   until a stop

``stream_events`` is the primitive for text; ``stream``, ``generate_text``,
``generate_batch`` and ``generate_ids`` (``GPT.generate``) are thin layers over
the same ``_decode`` loop. Beam search (``beam.py``) uses the same session and
logit processing.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gptlab.errors import GptlabError
from gptlab.generate.config import SampleConfig
from gptlab.generate.sampling import Sampler
from gptlab.generate.session import BatchSession, ContextWarning
from gptlab.generate.static_decode import start_static, use_static
from gptlab.generate.textstream import TextStream


@dataclass
class TokenEvent:
    """One step of a stream: the text now safe to show and what produced it.

    ``token_id`` is None on the closing event, which carries any held-back text and
    ``finish_reason``: ``"stop"`` (a stop token or string), ``"length"``
    (``max_new_tokens``) or ``"context"`` (the model's context limit).
    """

    text: str
    token_id: int | None = None
    prob: float | None = None  # probability of token_id under the distribution it was drawn from
    top: list[tuple[str, float]] = field(default_factory=list)  # the 5 most probable alternatives
    finish_reason: str | None = None
    index: int = 0  # which prompt of a batch


@dataclass
class _Request:
    """One sequence being decoded."""

    index: int
    slot: int
    sampler: Sampler
    stops: frozenset[int]
    history: list[int]  # prompt + generated: what the penalties look at
    text: TextStream | None
    logits: torch.Tensor
    n_new: int = 0
    reason: str | None = None


def stop_token_ids(config: SampleConfig, tokenizer: Any | None) -> frozenset[int]:
    """``config.stop_tokens`` plus the tokenizer's ``<|endoftext|>``."""
    eot = getattr(tokenizer, "eot_id", None) if tokenizer is not None else None
    return frozenset(config.stop_tokens) | ({eot} if eot is not None else set())


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of ``prompt``; an empty prompt starts from ``<|endoftext|>`` when the tokenizer has it."""
    if not isinstance(prompt, str):
        raise GptlabError(f"a prompt must be a string, got {type(prompt).__name__}")
    ids = list(tokenizer.encode(prompt, allowed_special="all")) if prompt else []
    if not ids:
        eot = getattr(tokenizer, "eot_id", None)
        if eot is None:
            raise GptlabError(
                "the prompt is empty and the tokenizer has no <|endoftext|> to start from; give a prompt"
            )
        ids = [eot]
    return ids


def _vocab(model: Any, tokenizer: Any | None) -> int:
    n = model.config.vocab_size
    return min(n, tokenizer.vocab_size) if tokenizer is not None else n


def _session_len(model: Any, prompts: Sequence[Sequence[int]], config: SampleConfig) -> int:
    longest = max(len(p) for p in prompts)
    return max(1, min(model.config.block_size, longest + config.max_new_tokens))


def _top(probs: torch.Tensor, tokenizer: Any | None, k: int = 5) -> list[tuple[str, float]]:
    values, ids = torch.topk(probs, min(k, probs.numel()))
    name = (lambda i: tokenizer.decode([i])) if tokenizer is not None else str
    return [(name(int(i)), float(p)) for p, i in zip(values.tolist(), ids.tolist(), strict=True)]


def _decode(
    session: BatchSession,
    requests: list[_Request],
    config: SampleConfig,
    tokenizer: Any | None,
    want_probs: bool,
) -> Iterator[TokenEvent]:
    """Sample, emit and step every request until each stops; yields one event per token, then a closing one."""
    active = list(requests)
    for r in active:
        if config.max_new_tokens == 0:
            r.reason = "length"
    while active:
        feed: dict[int, int] = {}
        for r in active:
            if r.reason is not None:
                continue
            logits = r.sampler.process(r.logits, r.history)
            token = r.sampler.choose(logits)
            if token in r.stops:
                r.reason = "stop"
                continue
            r.history.append(token)
            r.n_new += 1
            event = TokenEvent(r.text.push(token) if r.text is not None else "", token, index=r.index)
            if want_probs:
                probs = torch.softmax(logits, dim=-1)
                event.prob, event.top = float(probs[token]), _top(probs, tokenizer)
            if r.text is not None and r.text.stopped:
                r.reason = "stop"
            elif r.n_new >= config.max_new_tokens:
                r.reason = "length"
            elif session.full(r.slot):
                r.reason = "context"
                warnings.warn(
                    f"generation reached the context limit of {session.max_len} tokens; a model with "
                    f"learned or sinusoidal positions cannot go further, so it stops here",
                    ContextWarning,
                    stacklevel=3,
                )
            else:
                feed[r.slot] = token
            yield event
        for r in [r for r in active if r.reason is not None]:
            tail = r.text.finish() if r.text is not None else ""
            session.remove(r.slot)
            yield TokenEvent(tail, None, finish_reason=r.reason, index=r.index)
        active = [r for r in active if r.reason is None]
        if feed:
            for slot, logits in session.step(feed).items():
                next(r for r in active if r.slot == slot).logits = logits


def _start(
    model: Any,
    tokenizer: Any | None,
    prompts: Sequence[Sequence[int]],
    config: SampleConfig,
    cache_dtype: torch.dtype | None,
    seeds: Sequence[int | None] | None = None,
    want_probs: bool = False,
) -> tuple[BatchSession, list[_Request]]:
    """Prefill every prompt (one left-padded pass) and make its request.

    Where it can (on CUDA), the static path does it: CUDA graphs, the sampler inside them."""
    vocab, stops = _vocab(model, tokenizer), stop_token_ids(config, tokenizer)
    if use_static(model, config, cache_dtype, want_probs):
        return start_static(  # type: ignore[return-value]
            model,
            tokenizer,
            prompts,
            config,
            cache_dtype,
            seeds,
            _session_len(model, prompts, config),
            vocab,
            stops,
        )
    session = BatchSession(model, len(prompts), _session_len(model, prompts, config), cache_dtype)
    filled = session.add_many(prompts)
    requests = []
    for i, (slot, logits) in enumerate(filled):
        cfg = config if seeds is None else config.replace(seed=seeds[i])
        text = TextStream(tokenizer, config.stop) if tokenizer is not None else None
        requests.append(
            _Request(i, slot, Sampler(cfg, vocab), stops, list(session.tokens[slot]), text, logits)
        )
    return session, requests


def stream_events(
    model: Any,
    tokenizer: Any,
    prompt: str,
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
    want_probs: bool = True,
) -> Iterator[TokenEvent]:
    """Generate from ``prompt``, yielding a ``TokenEvent`` per token (with its probability and the top 5)."""
    config = config or SampleConfig()
    ids = encode_prompt(tokenizer, prompt)
    if config.beam_width > 1:
        from gptlab.generate.beam import beam_events

        yield from beam_events(model, tokenizer, ids, config, cache_dtype)
        return
    session, requests = _start(model, tokenizer, [ids], config, cache_dtype, want_probs=want_probs)
    yield from _decode(session, requests, config, tokenizer, want_probs)


def stream(
    model: Any,
    tokenizer: Any,
    prompt: str,
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
) -> Iterator[str]:
    """Yield text pieces as they are generated; a piece never ends inside a UTF-8 character."""
    for event in stream_events(model, tokenizer, prompt, config, cache_dtype=cache_dtype, want_probs=False):
        if event.text:
            yield event.text


def generate_text(
    model: Any,
    tokenizer: Any,
    prompt: str,
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
) -> str:
    """The continuation of ``prompt`` (without the prompt, stop tokens or stop strings)."""
    return "".join(stream(model, tokenizer, prompt, config, cache_dtype=cache_dtype))


def generate_batch(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
) -> list[str]:
    """Continue several prompts together (left-padded prefill, batched decode steps).

    Each result equals ``generate_text`` of that prompt alone: every request has its
    own sampler with ``config.seed``.
    """
    config = config or SampleConfig()
    if isinstance(prompts, str) or not prompts:
        raise GptlabError("generate_batch needs a non-empty list of prompt strings")
    if config.beam_width > 1:
        return [generate_text(model, tokenizer, p, config, cache_dtype=cache_dtype) for p in prompts]
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    session, requests = _start(model, tokenizer, ids, config, cache_dtype)
    out = [""] * len(prompts)
    for event in _decode(session, requests, config, tokenizer, want_probs=False):
        out[event.index] += event.text
    return out


def generate_ids(
    model: Any,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    cache_dtype: torch.dtype | None = None,
    **sampling: Any,
) -> torch.Tensor:
    """``idx`` (B, T) followed by ``max_new_tokens`` generated ids → (B, T + max_new_tokens).

    ``sampling`` takes any ``SampleConfig`` option (``temperature=0`` is greedy). Row b
    samples with seed ``seed + b``. A row that stops early (a stop token) is padded with
    that stop token; a learned-position model that reaches its context limit returns
    fewer columns (with a ``ContextWarning``).
    """
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.size(1) == 0:
        raise GptlabError(
            f"idx must be a (B, T) tensor of token ids with T ≥ 1, got {getattr(idx, 'shape', idx)!r}"
        )
    config = SampleConfig(max_new_tokens=max_new_tokens, **sampling)
    prompts = idx.tolist()
    seeds = None if config.seed is None else [config.seed + b for b in range(len(prompts))]
    if config.beam_width > 1:
        from gptlab.generate.beam import beam_search

        found = [beam_search(model, p, config, None, cache_dtype) for p in prompts]
        return _assemble(idx, prompts, [t for t, _ in found], [why for _, why in found], config)
    session, requests = _start(model, None, prompts, config, cache_dtype, seeds)
    rows: list[list[int]] = [[] for _ in prompts]
    for event in _decode(session, requests, config, None, want_probs=False):
        if event.token_id is not None:
            rows[event.index].append(event.token_id)
    return _assemble(idx, prompts, rows, [r.reason for r in requests], config)


def _assemble(
    idx: torch.Tensor,
    prompts: list[list[int]],
    rows: list[list[int]],
    reasons: list[str | None],
    config: SampleConfig,
) -> torch.Tensor:
    """Prompt + continuation per row; rows that stopped early are padded with a stop token."""
    width = max(len(r) for r in rows) if "context" in reasons else config.max_new_tokens
    pad = min(config.stop_tokens) if config.stop_tokens else 0
    out = [p + r + [pad] * (width - len(r)) for p, r in zip(prompts, rows, strict=True)]
    return torch.tensor(out, dtype=idx.dtype, device=idx.device)
