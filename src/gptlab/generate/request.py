"""One request while it decodes (``RequestState``): from next-token logits to a token, its text and whether to stop.

    l'   = Sampler.process(l, history, allowed)  penalties, logit bias, the grammar's mask (structured
                                                  output: ``grammar.Constraint``), /τ, top-k/top-p/min-p
    y    = Sampler.choose(l', position)           argmax (τ = 0) or y ~ softmax(l'), drawn with
                                                  u = h(seed, position, i): the same on every engine
                                                  (``Sampler(l, history, allowed)`` does both)
    log p(y) = l_y − log Σ_j exp(l_j)             of the model's raw logits l, whatever the sampling
                                                  settings: OpenAI's ``logprobs`` (as vLLM's default
                                                  ``raw_logprobs``) and what the playground shades
    y ∈ stop tokens             → finish "stop"   (y is not emitted)
    text = TextStream.push(y)   → a UTF-8-safe piece; a completed stop string → finish "stop"
    the grammar is complete     → finish "stop"   (nothing more may follow; the reply is whole)
    n_new = max_new_tokens      → finish "length"
    the context is full         → the window slides (a notice, once), or with
                                  ``slide=False`` finish "context"

``RequestState`` is that and nothing else: it never runs the model. The library's
decoding loop (``driver.py``), beam search's stream and the server's scheduler each
produce logits their own way (a ``BatchSession``, a batch of requests, a static cache)
and hand them to ``RequestState.advance``.

``TextStream`` is its incremental detokenisation: token ids in, safe text pieces out.

Two things are held back until they are known:

* the bytes of an unfinished multi-byte UTF-8 character (an incremental UTF-8
  decoder keeps them; a piece never ends inside a character);
* a tail of text that could be the start of a stop string. When a stop string
  completes, the text before it is emitted and the stream is ``stopped``.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from gptlab.errors import GptlabError
from gptlab.generate.config import SampleConfig
from gptlab.generate.grammar import Constraint
from gptlab.generate.plan import Decoder
from gptlab.generate.sampling import Sampler

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


class Alternative(NamedTuple):
    """One of the most probable tokens at a step: ``(text, prob, token_id, logprob)``."""

    text: str
    prob: float
    token_id: int
    logprob: float


@dataclass
class TokenEvent:
    """One step of a stream: the text now safe to show and what produced it.

    ``token_id`` is None on the closing event, which carries any held-back text and
    ``finish_reason``: ``"stop"`` (a stop token or string), ``"length"``
    (``max_new_tokens``) or ``"context"`` (the context limit, with ``slide=False``).
    ``notice`` is set once per request, on the step where the window starts to slide.
    """

    text: str
    token_id: int | None = None
    prob: float | None = None  # the model's probability of token_id: softmax of the raw logits
    top: list[Alternative] = field(default_factory=list)  # the most probable alternatives, best first
    finish_reason: str | None = None
    index: int = 0  # which prompt (or choice) of a batch
    logprob: float | None = None  # log(prob), computed as a log-softmax
    notice: str | None = None
    stop: bool = False  # the stop token that ended the request (text "": never shown, only reported)
    allowed: int | None = None  # structured output: how many tokens the grammar allowed at this step
    top_allowed: list[bool] | None = None  # structured output: whether it allowed each of ``top``


def stop_token_ids(config: SampleConfig, tokenizer: Tokenizer | None) -> frozenset[int]:
    """``config.stop_tokens`` plus the tokenizer's ``<|endoftext|>``."""
    eot = getattr(tokenizer, "eot_id", None) if tokenizer is not None else None
    return frozenset(config.stop_tokens) | ({eot} if eot is not None else set())


def vocab_size(model: Decoder, tokenizer: Tokenizer | None) -> int:
    """Tokens that may be chosen: the model's vocabulary, or the tokenizer's if smaller."""
    n = model.config.vocab_size
    return min(n, tokenizer.vocab_size) if tokenizer is not None else n


def session_len(model: Decoder, prompts: Sequence[Sequence[int]], config: SampleConfig) -> int:
    """Cache length for ``prompts`` and ``max_new_tokens``: at most the context (then the window slides)."""
    longest = max(len(p) for p in prompts)
    return max(1, min(model.config.block_size, longest + config.max_new_tokens))


def prompt_budget(context: int, max_new_tokens: int) -> int:
    """Prompt tokens kept: room is left for the new tokens, up to half the context.

    >>> prompt_budget(64, 20), prompt_budget(64, 500)
    (44, 32)
    """
    return context - min(max_new_tokens, context // 2)


def fit_prompt(
    ids: Sequence[int], context: int, max_new_tokens: int, label: str = "the prompt"
) -> tuple[list[int], str | None]:
    """``ids`` cut from the left to ``prompt_budget`` tokens → ``(ids, a message when cut, else None)``."""
    keep = prompt_budget(context, max_new_tokens)
    ids = list(ids)
    if len(ids) <= keep:
        return ids, None
    return ids[len(ids) - keep :], (
        f"{label} has {len(ids)} tokens; it was cut to its last {keep} tokens so that the "
        f"{max_new_tokens} requested tokens fit in the context (block_size={context})"
    )


def token_text(tokenizer: Tokenizer | None, token_id: int) -> str:
    """A token's text for display (bytes that are not whole UTF-8 characters show as U+FFFD)."""
    if tokenizer is None:
        return str(token_id)
    try:
        return str(tokenizer.token_bytes(token_id).decode("utf-8", errors="replace"))
    except (GptlabError, AttributeError):
        return str(tokenizer.decode([token_id]))


class RequestState:
    """The per-token step of one request; ``advance(logits)`` → the token's event.

    ``top_n`` None: no probabilities; 0: the chosen token's; N: also the N most probable.
    After each ``advance``, ``reason`` is None while the request goes on (feed ``token``
    to the model next), else why it finished; ``close()`` then gives the closing event.
    A config with a ``json_schema``, ``regex`` or ``grammar`` compiles it here (``constraint``; a
    ``GptlabError`` names what could not be compiled) and masks every step with it.
    """

    def __init__(
        self,
        config: SampleConfig,
        tokenizer: Tokenizer | None,
        model: Decoder,
        prompt_ids: Sequence[int],
        *,
        index: int = 0,
        top_n: int | None = None,
    ) -> None:
        self.config, self.tokenizer, self.index, self.top_n = config, tokenizer, index, top_n
        self.sampler = Sampler(config, vocab_size(model, tokenizer))
        self.stops = stop_token_ids(config, tokenizer)
        self.constraint: Constraint | None = None
        if config.constrained:
            if tokenizer is None:
                raise GptlabError(
                    f"a {config.constraints()[0]} constrains text: it needs the model's tokenizer"
                )
            self.constraint = Constraint(config, tokenizer, self.sampler.vocab_size, self.stops)
        self.history = list(prompt_ids)  # prompt + generated: what the penalties look at
        self.text = TextStream(tokenizer, config.stop) if tokenizer is not None else None
        self.n_new = 0  # emitted tokens
        self.sampled = 0  # every sampled token, a stop token included (OpenAI's completion_tokens)
        self.token: int | None = None
        self.reason: str | None = "length" if config.max_new_tokens == 0 else None
        self._noticed = False
        self.stop_event: TokenEvent | None = None  # the stop token drawn, with its probabilities if asked

    def advance(self, logits: torch.Tensor | int, full: str | None = None) -> TokenEvent | None:
        """Choose the next token from ``logits`` (vocab,) → its event, or None for a stop token.

        On the static path the token was already chosen inside the graph: ``logits`` is that token
        id (the request's seed seeded the graph's sampler). ``full`` is None while the context has
        room, else the sentence saying how the window slides. A stop token is kept as
        ``stop_event`` (``stop=True``), for a caller that reports every sampled token (OpenAI's
        completions ``logprobs``: ``completion_tokens`` counts it too).
        """
        raw: torch.Tensor | None = None
        allowed: torch.Tensor | None = None
        grammar = self.constraint
        if grammar is not None and grammar.done:  # complete before any token (an empty language)
            self.reason = "stop"
            return None
        if isinstance(logits, int):
            token = logits
        else:
            raw = logits
            allowed = grammar.allowed() if grammar is not None else None
            token = self.sampler(logits, self.history, allowed)  # drawn at the last token's position
            if allowed is not None and not bool(allowed[token]):  # no draw was possible: an allowed one
                token = int(torch.nonzero(allowed)[0])
        self.sampled += 1
        if token in self.stops:
            self.reason = "stop"
            self.stop_event = TokenEvent("", token, index=self.index, stop=True)
            if self.top_n is not None and raw is not None:
                self._probabilities(self.stop_event, raw, allowed)
            return None
        if grammar is not None:
            grammar.consume(token)
        self.history.append(token)
        self.n_new += 1
        self.token = token
        event = TokenEvent(self.text.push(token) if self.text is not None else "", token, index=self.index)
        if self.top_n is not None and raw is not None:
            self._probabilities(event, raw, allowed)
        if self.text is not None and self.text.stopped:
            self.reason = "stop"
        elif grammar is not None and grammar.done:
            self.reason = "stop"  # the grammar admits nothing more: the reply is complete
        elif self.n_new >= self.config.max_new_tokens:
            self.reason = "length"
        elif full is not None and not self.config.slide:
            self.reason = "context"
            event.notice = "generation reached the context limit and stops there (slide=False)"
        elif full is not None and not self._noticed:
            self._noticed, event.notice = True, full
        return event

    def close(self) -> TokenEvent:
        """The closing event: any held-back text and the finish reason."""
        tail = self.text.finish() if self.text is not None else ""
        return TokenEvent(tail, None, finish_reason=self.reason, index=self.index)

    def _probabilities(self, event: TokenEvent, raw: torch.Tensor, allowed: torch.Tensor | None) -> None:
        """``log softmax(l)`` of the raw logits over the model's whole output, as the echoed prompt's
        (``scoring.prompt_logprobs``): temperature, penalties, bias and truncation only choose the token.
        The alternatives are tokens the sampler may choose (ids below the tokenizer's vocabulary); under
        a grammar, the event also says how many tokens it allowed and which alternatives."""
        logp = torch.log_softmax(raw.float().cpu(), dim=-1)
        event.logprob = float(logp[event.token_id])
        event.prob = math.exp(event.logprob)
        if self.top_n:
            choosable = logp[: self.sampler.vocab_size]
            values, ids = torch.topk(choosable, min(self.top_n, choosable.numel()))
            event.top = [
                Alternative(token_text(self.tokenizer, i), math.exp(v), i, v)
                for v, i in zip(values.tolist(), ids.tolist(), strict=True)
            ]
        if allowed is not None:
            event.allowed = int(allowed.sum())
            event.top_allowed = [bool(allowed[a.token_id]) for a in event.top]


# ------------------------------------------------------------ textstream
def held_back(text: str, stop: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string.

    >>> held_back("hello wo", ["world"])
    2
    """
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class TextStream:
    """``push(token_id) -> text now safe to emit``; ``finish() -> the rest``; ``stopped``."""

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded text not yet emitted (a possible stop-string start)
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        return self._emit(self._decoder.decode(self.tokenizer.token_bytes(token_id)), final=False)

    def finish(self) -> str:
        """Flush the decoder and any held-back text (an incomplete character becomes U+FFFD)."""
        if self.stopped:
            return ""
        return self._emit(self._decoder.decode(b"", final=True), final=True)

    def _emit(self, new: str, final: bool) -> str:
        text = self._pending + new
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._pending = True, ""
            return text[:cut]
        keep = 0 if final else held_back(text, self.stop)
        self._pending = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]
