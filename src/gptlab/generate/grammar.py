"""Grammar-constrained decoding: a JSON schema, a regex or a Lark grammar as a mask over the vocabulary.

    allowed_t = { i : bytes(y_<t) + bytes(i) is a prefix of some string of the language L }
    l'_i      = l_i        if i ∈ allowed_t
              = −∞         otherwise                 (after penalties and bias, before τ and top-k/p)
    stop ids  ∈ allowed_t  ⇔  bytes(y_<t) ∈ L          (the reply may end only where it is complete)

The language is compiled by the grammar engine (``llguidance``, an Earley parser over a lexer whose
token masks are computed on a trie of the vocabulary's bytes): a JSON schema (``json_schema``), a
regular expression (``regex``) or a Lark grammar (``grammar``, which may inline JSON schemas with
``%json{...}``). The engine sees gptlab's own tokenizer as a table ``id → bytes`` (``token_table``):
every kind (characters, a trained BPE, GPT-2, a GGUF or Hugging Face vocabulary) is such a table.
Special tokens (and ids with no bytes) are never part of the language; the end of the reply is the
tokenizer's end-of-text (or, where it has none, an id past the vocabulary that is never sampled: the
reply then ends when the grammar admits nothing more).

The table is built once per tokenizer (``engine_tokenizer``, kept on the tokenizer object) and each compiled
grammar once per (tokenizer, grammar) (``compile_constraint``: a prototype matcher, copied per
request). A schema or grammar the engine cannot compile is a ``GptlabError`` with its message, which
names the offending part. ``Constraint`` is one request's matcher: ``allowed()`` → a boolean mask,
``consume(token)`` advances it, ``done`` says that nothing more may follow.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gptlab.errors import GptlabError

if TYPE_CHECKING:
    import llguidance

    from gptlab.generate.config import SampleConfig
    from gptlab.tokenizers.base import Tokenizer

#: JSON as the engine writes it: no free whitespace (a small model cannot loop on blanks), the
#: separators of Python's ``json.dumps`` (``{"a": 1, "b": [2, 3]}``), the tokens BPE vocabularies know best
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
#: compiled grammars kept per tokenizer (a server sees the same few schemas again and again)
CACHED_GRAMMARS = 64


@dataclass(frozen=True)
class TokenTable:
    """A vocabulary as the grammar engine sees it.

    ``tokens[i]`` are token ``i``'s bytes; ``special`` ids never match text (special tokens, an
    ``unk``, gaps of the id range); ``eos`` ends a reply where the grammar accepts: the tokenizer's
    end-of-text, or ``len(tokens) - 1``, an id added past the vocabulary when it has none.
    """

    tokens: list[bytes]
    special: frozenset[int]
    eos: int


def token_table(tokenizer: Tokenizer) -> TokenTable:
    """``tokenizer`` as ``TokenTable`` (every gptlab tokenizer decodes one id to its bytes)."""
    n = tokenizer.vocab_size
    special = set(tokenizer.special_tokens.values())
    for name in ("unk_id", "bos_id"):  # a char tokenizer's unk, a pretrained one's BOS
        extra = getattr(tokenizer, name, None)
        if isinstance(extra, int):
            special.add(extra)
    tokens: list[bytes] = []
    for i in range(n):
        try:
            data = tokenizer.token_bytes(i)
        except GptlabError:  # a gap in the ids
            data = b""
        if not data:
            special.add(i)
            data = f"<|gptlab:unused {i}|>".encode()
        tokens.append(data)
    eos = tokenizer.eot_id
    if eos is None or not 0 <= eos < n:
        eos = n
        tokens.append(b"<|gptlab:end|>")
        special.add(eos)
    return TokenTable(tokens, frozenset(special), eos)


class _Wrapped:
    """What ``llguidance.TokenizerWrapper`` reads: the table, and text → ids for the engine's own uses."""

    def __init__(self, tokenizer: Tokenizer, table: TokenTable) -> None:
        self.tokens = table.tokens
        self.eos_token_id = table.eos
        self.bos_token_id: int | None = None
        self.special_token_ids = sorted(table.special)
        self._tokenizer = tokenizer

    def __call__(self, data: bytes | str) -> list[int]:
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        try:
            return list(self._tokenizer.encode_ordinary(text))
        except GptlabError:  # a character outside a char vocabulary: the characters it has
            ids: list[int] = []
            for c in text:
                try:
                    ids.extend(self._tokenizer.encode_ordinary(c))
                except GptlabError:
                    pass
            return ids


@dataclass
class _Engine:
    """One tokenizer's engine view and its compiled grammars (least recently used first)."""

    tokenizer: llguidance.LLTokenizer
    table: TokenTable
    compiled: OrderedDict[str, llguidance.LLMatcher]
    lock: threading.Lock


#: where a tokenizer keeps its engine view (as a model keeps its ``DecodeEngine``)
ATTRIBUTE = "_gptlab_grammar_engine"
_BUILD_LOCK = threading.Lock()


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a dependency of gptlab
        raise GptlabError(
            "structured output needs the llguidance package (pip install llguidance==1.9.1)"
        ) from None
    return llguidance


def _engine(tokenizer: Tokenizer) -> _Engine:
    with _BUILD_LOCK:  # the server's request handlers and its scheduler thread may ask at once
        found = getattr(tokenizer, ATTRIBUTE, None)
        if not isinstance(found, _Engine):
            lg = _llguidance()
            table = token_table(tokenizer)
            lltok = lg.LLTokenizer(lg.TokenizerWrapper(_Wrapped(tokenizer, table)))
            found = _Engine(lltok, table, OrderedDict(), threading.Lock())
            setattr(tokenizer, ATTRIBUTE, found)
        return found


def engine_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The engine's view of ``tokenizer`` (built once per tokenizer object, then cached)."""
    return _engine(tokenizer).tokenizer


def grammar_source(config: SampleConfig) -> tuple[str, str] | None:
    """``(what, the engine's grammar)`` of the constraint ``config`` sets, or None.

    ``what`` names it in errors: ``"json_schema"``, ``"regex"`` or ``"grammar"``.
    """
    lg = _llguidance()
    if config.json_schema is not None:
        try:
            return "json_schema", lg.LLMatcher.grammar_from_json_schema(
                json.dumps(config.json_schema), defaults=JSON_OPTIONS
            )
        except (ValueError, TypeError) as exc:
            raise GptlabError(f"json_schema: {exc}") from None
    if config.regex is not None:
        return "regex", lg.LLMatcher.grammar_from_regex(config.regex)
    if config.grammar is not None:
        return "grammar", lg.LLMatcher.grammar_from_lark(config.grammar)
    return None


def _prototype(engine: _Engine, what: str, grammar: str) -> llguidance.LLMatcher:
    """The compiled matcher of ``grammar`` (compiled once; a request takes a copy)."""
    with engine.lock:
        found = engine.compiled.get(grammar)
        if found is not None:
            engine.compiled.move_to_end(grammar)
            return found
    matcher: llguidance.LLMatcher = _llguidance().LLMatcher(engine.tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise GptlabError(f"the {what} could not be compiled: {matcher.get_error().strip()}")
    with engine.lock:
        engine.compiled[grammar] = matcher
        while len(engine.compiled) > CACHED_GRAMMARS:
            engine.compiled.popitem(last=False)
    return matcher


def check_constraint(config: SampleConfig, tokenizer: Tokenizer, vocab: int | None = None) -> None:
    """Compile ``config``'s constraint for ``tokenizer`` (cached) and check that some token of the
    first ``vocab`` ids may start the reply: a ``GptlabError`` naming what fails, else nothing."""
    if config.constrained:
        constraint = Constraint(config, tokenizer, vocab or tokenizer.vocab_size)
        if not constraint.done:
            constraint.allowed()


class Constraint:
    """One request's position in its grammar: which tokens may come next, and whether it is complete.

    ``vocab`` is the sampler's vocabulary (the mask's length); ``stops`` are the ids that end the reply
    (end-of-text, end-of-turn, the request's ``stop_tokens``): each is allowed exactly when the text
    so far is a complete string of the language, whatever the grammar says of it as text.

    The next mask is computed ahead, on one worker thread shared by every request (``prefetch``):
    the engine releases the GIL, so the mask of step t+1 is built while the model computes the logits
    of step t+1, and ``allowed()`` usually finds it ready. Only that thread touches the matcher while
    a mask is pending; every other use waits for it first (``_settle``).
    """

    def __init__(
        self, config: SampleConfig, tokenizer: Tokenizer, vocab: int, stops: Collection[int] = ()
    ) -> None:
        source = grammar_source(config)
        if source is None:
            raise GptlabError("no json_schema, regex or grammar is set: nothing to constrain")
        self.what = source[0]
        engine = _engine(tokenizer)
        self.matcher = _prototype(engine, *source).deep_copy()
        self.vocab = vocab
        self.stops = torch.tensor(sorted(s for s in stops if 0 <= s < vocab), dtype=torch.long)
        self.tokenizer = tokenizer
        self.consumed = 0
        #: nothing may follow: the reply is complete (or the matcher failed: ``error``)
        self.done = bool(self.matcher.is_stopped())
        self._next: Future[torch.Tensor] | None = None
        self.prefetch()

    def _settle(self) -> None:
        """Wait for a pending mask (kept for ``allowed``): the matcher is then this thread's again."""
        if self._next is not None:
            wait([self._next])

    @property
    def accepting(self) -> bool:
        """The text so far is a complete string of the language (the reply may end here)."""
        self._settle()
        return bool(self.matcher.is_accepting())

    @property
    def error(self) -> str:
        self._settle()
        return str(self.matcher.get_error())

    def prefetch(self) -> None:
        """Start computing the next mask on the worker thread (nothing to do once ``done``)."""
        if not self.done and self._next is None:
            self._next = _worker().submit(self._mask)

    def _mask(self) -> torch.Tensor:
        bitmask = self.matcher.compute_bitmask()
        mask = torch.from_numpy(
            np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), count=self.vocab, bitorder="little").view(
                np.bool_
            )
        )
        if self.stops.numel():
            mask[self.stops] = bool(self.matcher.is_accepting())
        if not bool(mask.any()):
            error = self.matcher.get_error()
            raise GptlabError(
                f"the {self.what} allows no token of this vocabulary after "
                f"{self.consumed} generated token(s)" + (f": {error}" if error else "")
            )
        return mask

    def allowed(self) -> torch.Tensor:
        """The tokens that may come next: a boolean tensor (vocab,), stop ids set where the text is complete.

        Raises ``GptlabError`` when no token of this vocabulary can continue an incomplete text (a
        vocabulary without a character the language needs).
        """
        pending, self._next = self._next, None
        return pending.result() if pending is not None else self._mask()

    def consume(self, token: int) -> None:
        """Advance past ``token`` (one the mask allowed; a stop id ends the reply and is not consumed),
        then start on the next mask."""
        self._settle()
        self._next = None
        if not self.matcher.consume_token(token):
            raise GptlabError(
                f"the {self.what} does not allow token {token} here: {self.matcher.get_error()}"
            )
        self.consumed += 1
        self.done = bool(self.matcher.is_stopped())
        self.prefetch()

    def allowed_ids(self, limit: int | None = None) -> list[int]:
        """The ids ``allowed()`` admits, in id order (at most ``limit``): for display."""
        mask = self.allowed()
        self._next = _done(mask)  # the same mask again for the next ``allowed()``
        ids = torch.nonzero(mask).flatten().tolist()
        return [int(i) for i in ids[:limit]]


_WORKER: list[ThreadPoolExecutor] = []
_WORKER_LOCK = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    """The one thread that computes masks ahead (started on first use)."""
    with _WORKER_LOCK:
        if not _WORKER:
            _WORKER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="gptlab-grammar"))
        return _WORKER[0]


def _done(mask: torch.Tensor) -> Future[torch.Tensor]:
    future: Future[torch.Tensor] = Future()
    future.set_result(mask)
    return future


def accepts(config: SampleConfig, tokenizer: Tokenizer, ids: list[int], *, complete: bool = False) -> bool:
    """Whether ``ids`` (their bytes) are a prefix of ``config``'s language, or with ``complete`` a whole
    string of it: what a reply that ended with "length" (a prefix) or "stop" (whole) must be."""
    source = grammar_source(config)
    if source is None:
        return True
    matcher = _prototype(_engine(tokenizer), *source).deep_copy()
    if matcher.try_consume_tokens(list(ids)) != len(ids):
        return False
    return bool(matcher.is_accepting()) if complete else True


#: every character a JSON text of any schema may need outside its strings
JSON_CHARACTERS = '{}[]",: -+.0123456789eEtrufalsn'


def can_spell_json(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` can write JSON: each of ``JSON_CHARACTERS`` encodes and decodes back."""
    for c in JSON_CHARACTERS:
        try:
            if tokenizer.decode(tokenizer.encode_ordinary(c)) != c:
                return False
        except GptlabError:
            return False
    return True
