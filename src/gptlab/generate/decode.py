"""The decoding core: one loop that drives a ``BatchSession`` for any number of requests.

    prefill(prompt) → logits → token → step(token) → logits → …   until a stop

``stream_events`` is the primitive for text; ``stream``, ``generate_text``,
``generate_batch`` and ``generate_ids`` (``GPT.generate``) are thin layers over
the same ``_decode`` loop, which only runs the model: each request's per-token step
(sampling, stops, text, finish reason) is ``step.TokenStep``. Beam search (``beam.py``)
uses the same session and logit processing. Prompts are cut from the left to leave
room for ``max_new_tokens`` (``step.fit_prompt``); past the context the window slides.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gptlab.errors import GptlabError
from gptlab.generate.beam import beam_events, beam_search
from gptlab.generate.config import SampleConfig
from gptlab.generate.session import BatchSession, ContextWarning
from gptlab.generate.static_decode import start_static, use_static
from gptlab.generate.step import TokenEvent, TokenStep, fit_prompt, session_len


@dataclass
class _Row:
    """One sequence being decoded: its cache slot, its step and its next-token logits."""

    slot: int
    step: TokenStep
    logits: torch.Tensor


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


def fit_prompts(model: Any, prompts: Sequence[Sequence[int]], config: SampleConfig) -> list[list[int]]:
    """Every prompt cut from the left to leave room for ``max_new_tokens`` (a ``ContextWarning`` each)."""
    out = []
    for ids in prompts:
        ids, message = fit_prompt(ids, model.config.block_size, config.max_new_tokens)
        if message:
            warnings.warn(message, ContextWarning, stacklevel=4)
        out.append(ids)
    return out


def _decode(session: BatchSession, rows: list[_Row]) -> Iterator[TokenEvent]:
    """Step every row until each stops; yields one event per token, then a closing one per row."""
    active = list(rows)
    while active:
        feed: dict[int, int] = {}
        for r in active:
            if r.step.reason is not None:
                continue
            full = session.window_notice() if session.full(r.slot) else None
            event = r.step.advance(r.logits, full)
            if event is not None:
                if event.notice:
                    warnings.warn(event.notice, ContextWarning, stacklevel=3)
                yield event
            if r.step.reason is None:
                feed[r.slot] = r.step.token
        for r in [r for r in active if r.step.reason is not None]:
            session.remove(r.slot)
            yield r.step.close()
        active = [r for r in active if r.step.reason is None]
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
    top_n: int | None = None,
) -> tuple[BatchSession, list[_Row]]:
    """Prefill every prompt (one left-padded pass) and make its row (on CUDA: the static path's)."""
    prompts = fit_prompts(model, prompts, config)
    if use_static(model, config, cache_dtype, top_n is not None, len(prompts)):
        return start_static(model, tokenizer, prompts, config, cache_dtype, seeds)  # type: ignore[return-value]
    session = BatchSession(model, len(prompts), session_len(model, prompts, config), cache_dtype)
    rows = []
    for i, (slot, logits) in enumerate(session.add_many(prompts)):
        cfg = config if seeds is None else config.replace(seed=seeds[i])
        step = TokenStep(cfg, tokenizer, model, session.tokens[slot], index=i, top_n=top_n)
        rows.append(_Row(slot, step, logits))
    return session, rows


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
        yield from beam_events(model, tokenizer, fit_prompts(model, [ids], config)[0], config, cache_dtype)
        return
    session, rows = _start(model, tokenizer, [ids], config, cache_dtype, top_n=5 if want_probs else None)
    yield from _decode(session, rows)


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
    session, rows = _start(model, tokenizer, ids, config, cache_dtype)
    out = [""] * len(prompts)
    for event in _decode(session, rows):
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
    that stop token. Past the context the window slides; with ``slide=False`` a row that
    reaches the context limit ends there and the result has fewer columns.
    """
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.size(1) == 0:
        raise GptlabError(
            f"idx must be a (B, T) tensor of token ids with T ≥ 1, got {getattr(idx, 'shape', idx)!r}"
        )
    config = SampleConfig(max_new_tokens=max_new_tokens, **sampling)
    prompts = idx.tolist()
    seeds = None if config.seed is None else [config.seed + b for b in range(len(prompts))]
    if config.beam_width > 1:
        fitted = fit_prompts(model, prompts, config)
        found = [beam_search(model, p, config, None, cache_dtype) for p in fitted]
        return _assemble(idx, prompts, [t for t, _ in found], [why for _, why in found], config)
    session, rows = _start(model, None, prompts, config, cache_dtype, seeds)
    out: list[list[int]] = [[] for _ in prompts]
    for event in _decode(session, rows):
        if event.token_id is not None:
            out[event.index].append(event.token_id)
    return _assemble(idx, prompts, out, [r.step.reason for r in rows], config)


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
