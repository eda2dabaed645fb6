"""The one driver of generation: the public entry points, the decoding loop, the route for encoder–decoders.

The public entry points serve decoder-only and encoder–decoder models alike:

    prompt → (the model to decode, the ids to start from) → start → decode_rows → events

``stream_events`` is the primitive for text; ``stream``, ``generate_text`` and ``generate_batch``
are thin layers over it, and ``generate_ids`` (``GPT.generate``) over the same loop for token ids.
What a prompt means depends on the model kind (``PROMPTS``): a decoder continues it; an
encoder–decoder translates it (the source is encoded once, ``EncoderDecoder.bind``, and the target
starts from ``<|endoftext|>``); a bidirectional encoder cannot generate. Beam search is ``beam.py``. Prompts are cut from the
left to leave room for ``max_new_tokens`` (``request.fit_prompt``); past the context the window slides.

The decoding loop prefills every prompt into the planned session, then steps until each row stops:

    prefill(prompts) → per row: logits (or, static, the token) → RequestState → token → step → …

``start`` asks the model's ``PreparedDecoding`` for a plan and prefills the prompts into the session it
names (``STARTS``: dynamic or static); ``decode_rows`` steps that session for the rows still going.
Each request's per-token work (sampling, stops, text, finish reason) is its ``request.RequestState``; a
static row's state is handed the token already chosen inside the graph.

Encoder–decoder generation encodes the source once, then decodes the target like a GPT:

    H_enc = Encoder(source);  K_enc, V_enc = H_enc·W_K, H_enc·W_V   per decoder layer, once
    y_0 = BOS;  y_t ~ choose(P(· | y_<t, source))                   until EOS (= <|endoftext|>)

``EncoderDecoder.bind(source)`` holds the cached cross-attention keys and values and
looks like a GPT to ``BatchSession``, so every strategy of ``gptlab.generate`` (greedy,
temperature, top-k/p, min-p, penalties, beam search) runs on it unchanged. The public entry
points (``stream_events``, ``generate_text``, ``generate_batch``) take an encoder–decoder as they
take a GPT: ``bind_source`` is what they call for one (``gptlab.generate.driver.PROMPTS``). A
bidirectional encoder (``arch="encoder"``) predicts masked tokens, not the next one, so it cannot
generate.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gptlab.errors import GptlabError
from gptlab.generate.beam import beam_events, beam_search
from gptlab.generate.config import SampleConfig
from gptlab.generate.lookup import PromptLookup
from gptlab.generate.plan import DecodePlan, Decoder, logits_of
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.prepared import PreparedDecoding, prepared_of
from gptlab.generate.request import RequestState, TokenEvent, fit_prompt, session_len, vocab_size
from gptlab.generate.session import BatchSession, ContextWarning, Session
from gptlab.hardware import keep_heap, release_memory
from gptlab.model.encdec import EncoderDecoder

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


@dataclass
class Row:
    """One sequence being decoded: its cache slot, its step and what the session gave it last
    (next-token logits on the dynamic cache, the next token on the static one)."""

    slot: int
    state: RequestState
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


def _start_dynamic(engine: PreparedDecoding, plan: DecodePlan, request: Request) -> tuple[Session, list[Row]]:
    model, prompts = engine.model, request.prompts
    max_len = session_len(model, prompts, request.config)
    session = engine.dynamic_session(
        plan, len(prompts), max_len, request.cache_dtype, prefix_cache=request.prefix_cache
    )
    rows = []
    for i, (slot, logits) in enumerate(session.add_many(prompts)):
        state = RequestState(
            request.config_of(i), request.tokenizer, model, session.tokens[slot], index=i, top_n=request.top_n
        )
        drafter = PromptLookup(session.tokens[slot]) if plan.draft == "prompt-lookup" else None
        rows.append(Row(slot, state, logits, drafter))
    return session, rows


def _start_static(engine: PreparedDecoding, plan: DecodePlan, request: Request) -> tuple[Session, list[Row]]:
    """Each row's ``RequestState`` (stops, text, finish reason) is the dynamic path's; the seed its
    ``Sampler`` drew seeds the row inside the graph."""
    model, prompts, tokenizer = engine.model, request.prompts, request.tokenizer
    max_len = session_len(model, prompts, request.config)
    session = engine.static_session(
        plan, len(prompts), max_len, request.cache_dtype, vocab_size(model, tokenizer)
    )
    states = [RequestState(request.config_of(i), tokenizer, model, p, index=i) for i, p in enumerate(prompts)]
    seeds_drawn = [state.sampler.seed for state in states]
    added = session.add_many(prompts, [state.config for state in states], seeds_drawn)
    rows = []
    for state, (slot, token) in zip(states, added, strict=True):
        state.history = list(session.tokens[slot])  # the prompt as cached (cut to the context)
        rows.append(Row(slot, state, token))
    return session, rows


Starter = Callable[[PreparedDecoding, DecodePlan, Request], tuple[Session, list[Row]]]
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
    engine = prepared_of(model)
    if engine.model.device.type == "cpu":
        keep_heap()  # again: a model loaded since maps its large blocks (gptlab.hardware.map_large_blocks)
        release_memory()  # the caches of earlier requests, freed, go back to the system before this one
    plan = engine.plan(len(fitted), config=config, cache_dtype=cache_dtype, want_probs=top_n is not None)
    request = Request(tokenizer, fitted, config, cache_dtype, seeds, top_n, prefix_cache)
    return STARTS[plan.session](engine, plan, request)


def advance_row(session: Session, row: Row) -> TokenEvent | None:
    """Row ``row``'s next token from ``row.logits``, drawn by its ``RequestState`` (told when the row's
    cache is full, so that the window slides) → the event to emit, if any. Afterwards the row has
    stopped (``row.state.reason``) or waits to be fed ``row.state.token``."""
    full = session.window_notice() if session.full(row.slot) else None
    return row.state.advance(row.logits, full)


def step_rows(session: Session, rows: Sequence[Row]) -> None:
    """One batched forward pass that feeds each row the token it chose; its next logits (on the static
    cache, its next token) land in ``row.logits``."""
    by_slot, token = {}, {}
    for r in rows:
        assert r.state.token is not None  # a row is stepped only after advance_row chose its token
        by_slot[r.slot], token[r.slot] = r, r.state.token
    for slot, logits in session.step(token).items():
        by_slot[slot].logits = logits


def retire_row(session: Session, row: Row) -> TokenEvent:
    """Free a stopped row's slot → its closing event (the text held back, the finish reason)."""
    session.remove(row.slot)
    return row.state.close()


def decode_rows(session: Session, rows: list[Row]) -> Iterator[TokenEvent]:
    """Step every row until each stops; yields one event per token, then a closing one per row.

    The thread-free core every caller drives: ``advance_row`` each row, feed the ones that go on
    (``step_rows``: one batched pass; a row with a prompt-lookup drafter verifies its drafts), then
    ``retire_row`` the ones that stopped. The server's scheduler drives the same three functions
    from its thread, with its own admission, fairness and cancellation."""
    active = list(rows)
    while active:
        fed = []
        for r in active:
            if r.state.reason is not None:
                continue
            event = advance_row(session, r)
            if event is not None:
                if event.notice:
                    warnings.warn(event.notice, ContextWarning, stacklevel=3)
                yield event
            if r.state.reason is None and r.state.token is not None:
                if r.drafter is not None and isinstance(session, BatchSession):
                    yield from feed_drafted(session, r, r.drafter)
                else:
                    fed.append(r)
        for r in [r for r in active if r.state.reason is not None]:
            yield retire_row(session, r)
        active = [r for r in active if r.state.reason is None]
        if fed:
            step_rows(session, fed)


def feed_drafted(session: BatchSession, r: Row, lookup: PromptLookup) -> Iterator[TokenEvent]:
    """Feed the row's chosen token with a draft after it (``gptlab.generate.lookup``), verify the draft
    in one pass and emit what the row's own step chooses; leaves ``r.logits`` for the next token."""
    while True:
        token = r.state.token
        assert token is not None
        lookup.append(token)
        left = r.state.config.max_new_tokens - r.state.n_new  # tokens the row may still emit
        draft = lookup.propose(min(session.room(r.slot) - 1, left))
        if not draft:
            r.logits = session.step({r.slot: token})[r.slot]
            return
        logits = session.extend(r.slot, [token, *draft])  # logits[i]: after token, draft[:i]
        for i, guess in enumerate(draft):
            event = r.state.advance(logits[i])
            if event is not None:
                yield event
            if r.state.reason is not None:
                lookup.verified(len(draft), i)
                return
            if r.state.token != guess:  # keep token, draft[:i]; feed the step's own choice next
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
    if route(model, config) == "beam":
        yield from beam_events(model, tokenizer, fit_prompts(model, [ids], config)[0], config, cache_dtype)
        return
    top_n = 5 if want_probs else None
    session, rows = start(
        model, tokenizer, [ids], config, cache_dtype, top_n=top_n, prefix_cache=prefix_cache
    )
    yield from decode_rows(session, rows)


def route(model: Decoder, config: SampleConfig) -> str:
    """How the plan drives a request of ``config`` on ``model`` (``plan.ROUTES``): the batched rows,
    beam search, or (an unbound encoder–decoder) each source bound alone."""
    return prepared_of(model).plan(1, config=config).route


# ------------------------------------------------------------ seq2seq
def is_seq2seq(model: Decoder) -> bool:
    """True for an encoder–decoder model (it generates from a source)."""
    return getattr(model.config, "arch", "decoder") == "encoder-decoder"


def check_generative(model: Decoder, name: str = "this model") -> None:
    """Refuse a bidirectional encoder, which has no next-token distribution to sample from."""
    if not getattr(model.config, "causal", True):
        raise GptlabError(
            f"{name} is a bidirectional encoder (masked-language model): it predicts masked tokens, "
            f'not the next one, so it cannot generate; use `gptlab fill CKPT "text with [MASK]"`'
        )


def source_ids(tokenizer: Tokenizer, source: str) -> list[int]:
    """Token ids of a source text (it must not be empty)."""
    if not isinstance(source, str):
        raise GptlabError(f"a source must be a string, got {type(source).__name__}")
    ids = list(tokenizer.encode(source)) if source else []
    if not ids:
        raise GptlabError("an encoder-decoder model needs a source to translate; give a non-empty --prompt")
    return ids


def bos_ids(tokenizer: Tokenizer) -> list[int]:
    """The target's first token: ``<|endoftext|>``."""
    eot = getattr(tokenizer, "eot_id", None)
    if eot is None:
        raise GptlabError("the tokenizer has no <|endoftext|>, which begins and ends a target")
    return [int(eot)]


def bind_source(model: Decoder, tokenizer: Tokenizer, source: str) -> tuple[Decoder, list[int]]:
    """The decoder bound to ``source`` (encoded once) and the ids its target starts from."""
    if not isinstance(model, EncoderDecoder):
        raise GptlabError(f"only an encoder-decoder model binds a source, not a {type(model).__name__}")
    ids = source_ids(tokenizer, source)
    return model.bind(ids), bos_ids(tokenizer)


def stream_ids(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    source: Sequence[int],
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
    want_probs: bool = False,
) -> Iterator[TokenEvent]:
    """The target's events for a source given as token ids (the server's jobs)."""
    config = config or SampleConfig()
    if not source:
        raise GptlabError("an encoder-decoder model needs a source to translate; give a non-empty prompt")
    yield from decode_events(
        model.bind(source), tokenizer, bos_ids(tokenizer), config, cache_dtype, want_probs
    )


def target_ids(
    model: EncoderDecoder,
    source: Sequence[int],
    bos_id: int,
    config: SampleConfig,
    cache_dtype: torch.dtype | None = None,
) -> tuple[list[int], str]:
    """Token ids of the target of ``source`` (ids) → ``(ids without BOS and the stop token, finish_reason)``.

    Stops at ``config.stop_tokens`` (give the EOS id there) or ``max_new_tokens``.
    """
    bound = model.bind(source)
    if route(bound, config) == "beam":
        return beam_search(bound, [bos_id], config, None, cache_dtype)
    session, rows = start(bound, None, [[bos_id]], config, cache_dtype)
    tokens = [e.token_id for e in decode_rows(session, rows) if e.token_id is not None]
    return tokens, rows[0].state.reason or "length"


@torch.no_grad()
def greedy_uncached(
    model: EncoderDecoder, source: Sequence[int], bos_id: int, steps: int
) -> list[torch.Tensor]:
    """Reference: the next-token logits of greedy decoding, re-running encoder and decoder each step."""
    src = torch.tensor([list(source)], device=model.device)
    ids, out = [bos_id], []
    for _ in range(steps):
        logits = logits_of(model.run(torch.tensor([ids], device=model.device), source=src))[0, -1].float()
        out.append(logits)
        ids.append(int(logits.argmax()))
    return out


# ------------------------------------------------------------ the entry points
def encode_prompt(tokenizer: Tokenizer, prompt: str) -> list[int]:
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


def _continue_prompt(model: Decoder, tokenizer: Tokenizer, prompt: str) -> tuple[Decoder, list[int]]:
    """A decoder continues its prompt."""
    return model, encode_prompt(tokenizer, prompt)


def _cannot_generate(model: Decoder, tokenizer: Tokenizer, prompt: str) -> tuple[Decoder, list[int]]:
    check_generative(model)  # raises: a bidirectional encoder has no next-token distribution
    raise GptlabError("this model cannot generate")


PromptReader = Callable[[Decoder, Any, str], tuple[Decoder, list[int]]]
#: per model kind (``config.arch``): the model to decode and the ids it starts from
PROMPTS: dict[str, PromptReader] = {
    "decoder": _continue_prompt,
    "encoder-decoder": bind_source,
    "encoder": _cannot_generate,
}


def read_prompt(model: Decoder, tokenizer: Tokenizer, prompt: str) -> tuple[Decoder, list[int]]:
    """``prompt`` read for this kind of model → ``(the model to decode, its starting ids)``.

    Call it before printing anything: an empty source or a prompt the tokenizer refuses fails here.
    """
    if not isinstance(prompt, str):
        raise GptlabError(f"a prompt must be a string, got {type(prompt).__name__}")
    return PROMPTS[getattr(model.config, "arch", "decoder")](model, tokenizer, prompt)


def stream_events(
    model: Decoder,
    tokenizer: Tokenizer,
    prompt: str,
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
    want_probs: bool = True,
    prefix_cache: PrefixCache | None = None,
) -> Iterator[TokenEvent]:
    """Generate from ``prompt``, yielding a ``TokenEvent`` per token (with its probability and the top 5).

    For an encoder–decoder the prompt is the source and the events are its target's tokens.
    ``prefix_cache`` (a ``PrefixCache`` kept between calls, as ``gptlab chat`` keeps one): the
    prompt reuses the keys and values of the longest prefix cached there, and leaves its own and
    its reply's. An encoder–decoder does not use it (its keys depend on the source as well).
    """
    config = config or SampleConfig()
    decoder, ids = read_prompt(model, tokenizer, prompt)
    if getattr(model.config, "arch", "decoder") != "decoder":
        prefix_cache = None
    yield from decode_events(decoder, tokenizer, ids, config, cache_dtype, want_probs, prefix_cache)


def stream(
    model: Decoder,
    tokenizer: Tokenizer,
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
    model: Decoder,
    tokenizer: Tokenizer,
    prompt: str,
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
) -> str:
    """The continuation of ``prompt`` (without the prompt, stop tokens or stop strings)."""
    return "".join(stream(model, tokenizer, prompt, config, cache_dtype=cache_dtype))


def generate_batch(
    model: Decoder,
    tokenizer: Tokenizer,
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
    read = [read_prompt(model, tokenizer, p) for p in prompts]
    shared = all(decoder is model for decoder, _ in read)  # an encoder-decoder binds each source alone
    if route(model, config) != "rows" or not shared:
        return [generate_text(model, tokenizer, p, config, cache_dtype=cache_dtype) for p in prompts]
    session, rows = start(model, tokenizer, [ids for _, ids in read], config, cache_dtype)
    out = [""] * len(prompts)
    for event in decode_rows(session, rows):
        out[event.index] += event.text
    return out


def generate_ids(
    model: Decoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    cache_dtype: torch.dtype | None = None,
    **sampling: Any,
) -> torch.Tensor:
    """``idx`` (B, T) followed by ``max_new_tokens`` generated ids → (B, T + max_new_tokens).

    A decoder-only model's continuation (an encoder–decoder's target: ``seq2seq.target_ids``).

    ``sampling`` takes any ``SampleConfig`` option (``temperature=0`` is greedy). Row b
    samples with seed ``seed + b``. A row that stops early (a stop token) is padded with
    that stop token. Past the context the window slides; with ``slide=False`` a row that
    reaches the context limit ends there and the result has fewer columns.
    """
    check_generative(model)  # a bidirectional encoder has no next-token distribution
    if isinstance(model, EncoderDecoder):
        raise GptlabError(
            "an encoder–decoder model generates from a source: use gptlab.generate.driver.target_ids, "
            "or gptlab.generate.generate_text with the source as the prompt"
        )
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.size(1) == 0:
        raise GptlabError(
            f"idx must be a (B, T) tensor of token ids with T ≥ 1, got {getattr(idx, 'shape', idx)!r}"
        )
    config = SampleConfig(max_new_tokens=max_new_tokens, **sampling)
    prompts = idx.tolist()
    seeds = None if config.seed is None else [config.seed + b for b in range(len(prompts))]
    if route(model, config) == "beam":
        fitted = fit_prompts(model, prompts, config)
        found = [beam_search(model, p, config, None, cache_dtype) for p in fitted]
        return _assemble(idx, prompts, [t for t, _ in found], [why for _, why in found], config)
    session, rows = start(model, None, prompts, config, cache_dtype, seeds)
    out: list[list[int]] = [[] for _ in prompts]
    for event in decode_rows(session, rows):
        if event.token_id is not None:
            out[event.index].append(event.token_id)
    return _assemble(idx, prompts, out, [r.state.reason for r in rows], config)


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


__all__ = [
    "bind_source",
    "bos_ids",
    "check_generative",
    "greedy_uncached",
    "is_seq2seq",
    "source_ids",
    "stream_ids",
    "target_ids",
]
