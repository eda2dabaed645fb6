"""The decoding loop: prefill every prompt into the planned session, then step until each row stops.

    prefill(prompts) → per row: logits (or, static, the token) → TokenStep → token → step → …

``start`` asks the model's ``DecodeEngine`` for a plan and prefills the prompts into the session it
names (``STARTS``: dynamic or static); ``decode_rows`` steps that session for the rows still going.
Each request's per-token step (sampling, stops, text, finish reason) is ``step.TokenStep``; a
static row's step is handed the token already chosen inside the graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gptlab.generate.beam import beam_events
from gptlab.generate.config import SampleConfig
from gptlab.generate.decoder import Decoder
from gptlab.generate.engine import DecodeEngine, engine_of
from gptlab.generate.lookup import PromptLookup
from gptlab.generate.plan import DecodePlan
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.session import BatchSession
from gptlab.generate.step import TokenEvent, TokenStep, fit_prompt, session_len, vocab_size
from gptlab.generate.window import ContextWarning, Session

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


@dataclass
class Row:
    """One sequence being decoded: its cache slot, its step and what the session gave it last
    (next-token logits on the dynamic cache, the next token on the static one)."""

    slot: int
    step: TokenStep
    logits: torch.Tensor | int
    drafter: PromptLookup | None = None  # prompt lookup, where the plan says so


def fit_prompts(model: Decoder, prompts: Sequence[Sequence[int]], config: SampleConfig) -> list[list[int]]:
    """Every prompt cut from the left to leave room for ``max_new_tokens`` (a ``ContextWarning`` each)."""
    out = []
    for ids in prompts:
        fitted, message = fit_prompt(ids, model.config.block_size, config.max_new_tokens)
        if message:
            warnings.warn(message, ContextWarning, stacklevel=5)
        out.append(fitted)
    return out


@dataclass(frozen=True)
class Request:
    """What ``start`` was asked for, handed to the session's starter."""

    tokenizer: Tokenizer | None
    prompts: list[list[int]]
    config: SampleConfig
    cache_dtype: torch.dtype | None
    seeds: Sequence[int | None] | None
    top_n: int | None
    prefix_cache: PrefixCache | None = None

    def config_of(self, i: int) -> SampleConfig:
        return self.config if self.seeds is None else self.config.replace(seed=self.seeds[i])


def _start_dynamic(engine: DecodeEngine, plan: DecodePlan, request: Request) -> tuple[Session, list[Row]]:
    model, prompts = engine.model, request.prompts
    max_len = session_len(model, prompts, request.config)
    session = engine.dynamic_session(
        plan, len(prompts), max_len, request.cache_dtype, prefix_cache=request.prefix_cache
    )
    rows = []
    for i, (slot, logits) in enumerate(session.add_many(prompts)):
        step = TokenStep(
            request.config_of(i), request.tokenizer, model, session.tokens[slot], index=i, top_n=request.top_n
        )
        drafter = PromptLookup(session.tokens[slot]) if plan.draft == "prompt-lookup" else None
        rows.append(Row(slot, step, logits, drafter))
    return session, rows


def _start_static(engine: DecodeEngine, plan: DecodePlan, request: Request) -> tuple[Session, list[Row]]:
    """Each row's ``TokenStep`` (stops, text, finish reason) is the dynamic path's; the seed its
    ``Sampler`` drew seeds the row inside the graph."""
    model, prompts, tokenizer = engine.model, request.prompts, request.tokenizer
    max_len = session_len(model, prompts, request.config)
    session = engine.static_session(
        plan, len(prompts), max_len, request.cache_dtype, vocab_size(model, tokenizer)
    )
    steps = [TokenStep(request.config_of(i), tokenizer, model, p, index=i) for i, p in enumerate(prompts)]
    seeds_drawn = [step.sampler.seed for step in steps]
    added = session.add_many(prompts, [step.config for step in steps], seeds_drawn)
    rows = []
    for step, (slot, token) in zip(steps, added, strict=True):
        step.history = list(session.tokens[slot])  # the prompt as cached (cut to the context)
        rows.append(Row(slot, step, token))
    return session, rows


Starter = Callable[[DecodeEngine, DecodePlan, Request], tuple[Session, list[Row]]]
#: how each kind of session is started
STARTS: dict[str, Starter] = {"dynamic": _start_dynamic, "static": _start_static}


def start(
    model: Decoder,
    tokenizer: Tokenizer | None,
    prompts: Sequence[Sequence[int]],
    config: SampleConfig,
    cache_dtype: torch.dtype | None,
    seeds: Sequence[int | None] | None = None,
    top_n: int | None = None,
    prefix_cache: PrefixCache | None = None,
) -> tuple[Session, list[Row]]:
    """Fit the prompts, plan the decode and prefill every prompt (one pass) → the session and a row each.

    ``prefix_cache``: reused and filled where the plan picks the dynamic cache; the static cache
    bypasses it (the plan decides, so a request is correct either way)."""
    fitted = fit_prompts(model, prompts, config)
    engine = engine_of(model)
    plan = engine.plan(len(fitted), config=config, cache_dtype=cache_dtype, want_probs=top_n is not None)
    request = Request(tokenizer, fitted, config, cache_dtype, seeds, top_n, prefix_cache)
    return STARTS[plan.session](engine, plan, request)


def decode_rows(session: Session, rows: list[Row]) -> Iterator[TokenEvent]:
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
            if r.step.reason is None and r.step.token is not None:
                if r.drafter is not None and isinstance(session, BatchSession):
                    yield from feed_drafted(session, r, r.drafter)
                else:
                    feed[r.slot] = r.step.token
        for r in [r for r in active if r.step.reason is not None]:
            session.remove(r.slot)
            yield r.step.close()
        active = [r for r in active if r.step.reason is None]
        if feed:
            by_slot = {r.slot: r for r in active}
            for slot, logits in session.step(feed).items():
                by_slot[slot].logits = logits


def feed_drafted(session: BatchSession, r: Row, lookup: PromptLookup) -> Iterator[TokenEvent]:
    """Feed the row's chosen token with a draft after it (``gptlab.generate.lookup``), verify the draft
    in one pass and emit what the row's own step chooses; leaves ``r.logits`` for the next token."""
    while True:
        token = r.step.token
        assert token is not None
        lookup.append(token)
        left = r.step.config.max_new_tokens - r.step.n_new  # tokens the row may still emit
        draft = lookup.propose(min(session.room(r.slot) - 1, left))
        if not draft:
            r.logits = session.step({r.slot: token})[r.slot]
            return
        logits = session.extend(r.slot, [token, *draft])  # logits[i]: after token, draft[:i]
        for i, guess in enumerate(draft):
            event = r.step.advance(logits[i])
            if event is not None:
                yield event
            if r.step.reason is not None:
                lookup.verified(len(draft), i)
                return
            if r.step.token != guess:  # keep token, draft[:i]; feed the step's own choice next
                session.rewind(r.slot, len(draft) - i)
                lookup.verified(len(draft), i)
                break
            lookup.append(guess)
        else:
            lookup.verified(len(draft), len(draft))
            r.logits = logits[len(draft)]
            return


def decode_events(
    model: Decoder,
    tokenizer: Tokenizer,
    ids: Sequence[int],
    config: SampleConfig,
    cache_dtype: torch.dtype | None = None,
    want_probs: bool = False,
    prefix_cache: PrefixCache | None = None,
) -> Iterator[TokenEvent]:
    """The events of one request from token ids, on the model to decode (a decoder, or a bound one):
    beam search (no prefix cache), or ``start`` and ``decode_rows`` (with the top 5 alternatives when
    ``want_probs``; reusing and filling ``prefix_cache`` on the dynamic cache)."""
    if config.beam_width > 1:
        yield from beam_events(model, tokenizer, fit_prompts(model, [ids], config)[0], config, cache_dtype)
        return
    top_n = 5 if want_probs else None
    session, rows = start(
        model, tokenizer, [ids], config, cache_dtype, top_n=top_n, prefix_cache=prefix_cache
    )
    yield from decode_rows(session, rows)
