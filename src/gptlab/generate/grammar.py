"""Grammar-constrained decoding: a JSON schema, a regex or a Lark grammar as a mask over the vocabulary.

    allowed_t = { i : bytes(y_<t) + bytes(i) is a prefix of some string of the language L }
    l'_i      = l_i        if i ∈ allowed_t
              = −∞         otherwise                 (after penalties and bias, before τ and top-k/p)
    stop ids  ∈ allowed_t  ⇔  bytes(y_<t) ∈ L          (the reply may end only where it is complete)

The language is compiled by the grammar engine (``llguidance``, an Earley parser over a lexer whose
token masks are computed on a trie of the vocabulary's bytes): a JSON schema (``json_schema``, written
as ``gptlab.tokenizers.json_writing`` says: no free whitespace, integers within I-JSON's range), a
regular expression (``regex``) or a Lark grammar (``grammar``, which may inline JSON schemas with
``%json{...}``). The engine sees gptlab's own tokenizer as a table ``id → bytes`` (``token_table``):
every kind (characters, a trained BPE, GPT-2, a GGUF or Hugging Face vocabulary) is such a table.
Special tokens (and ids with no bytes) are never part of the language; the end of the reply is the
tokenizer's end-of-text (or, where it has none, an id past the vocabulary that is never sampled: the
reply then ends when the grammar admits nothing more).

The table is built once per tokenizer (``engine_tokenizer``, kept on the tokenizer object) and each
grammar compiled once per tokenizer (a prototype matcher, least recently used dropped first, copied
per request). A schema or grammar the engine cannot compile is a ``GptlabError`` with the engine's
message, which names the offending part (``check_constraint`` finds it before a request starts).
``Constraint`` is one request's matcher: ``allowed()`` → a boolean mask, ``consume(token)`` advances
it, ``done`` says that the text is complete and nothing may follow.

A batch's masks are computed together (``fill_masks``): a constraint that moved (new, or past a
consumed token) waits in its thread's list, and the first ``allowed()`` of the next step computes
every waiting row's mask into one bitmask ``(rows, ⌈|V|/32⌉)`` int32 (the engine writes each row in
place, without the interpreter lock), unpacks it to booleans in one operation and sets the stop ids
row by row on that array; each row's ``allowed()`` is then a view of its line. So the server's
scheduler and the library's batched loop, which ask row after row on one thread, pay one pass for
the batch, and a row's mask is still its own (a free neighbour never sees it).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from gptlab.errors import GptlabError
from gptlab.tokenizers.json_writing import LAYOUT, as_written

if TYPE_CHECKING:
    import llguidance

    from gptlab.generate.config import SampleConfig
    from gptlab.tokenizers.base import Tokenizer

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


#: where a tokenizer keeps its engine view (as a model keeps its ``PreparedDecoding``)
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
                json.dumps(as_written(config.json_schema)), defaults=LAYOUT
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


class _Waiting(threading.local):
    """The constraints of this thread whose mask is out of date, by ``id`` (weakly held: a cancelled
    request's constraint goes with its step)."""

    def __init__(self) -> None:
        self.rows: dict[int, weakref.ref[Constraint]] = {}

    def take(self) -> list[Constraint]:
        """The waiting constraints still alive; the list is emptied."""
        rows = [c for c in (ref() for ref in self.rows.values()) if c is not None]
        self.rows.clear()
        return rows


_WAITING = _Waiting()


def fill_masks(constraints: Iterable[Constraint]) -> None:
    """Compute the masks of ``constraints`` (those out of date) together: one bitmask for the rows of
    each vocabulary, filled row by row by the engine in place, unpacked in one operation,

        allowed_{r,i} = (word_{r,⌊i/32⌋} >> (i mod 32)) & 1        (the engine's little-endian bitmask)

    then per row the stop ids (set exactly where the text is complete) and the end id that is not a
    stop (never allowed); a row left with no token keeps its error for its own ``allowed()`` to raise.
    The engine's thread pool (``LLExecutor``) was measured slower here than this loop: a mask costs a
    few microseconds once its lexer states are built, less than handing the rows to threads.
    """
    groups: dict[tuple[int, int], list[Constraint]] = {}
    for c in constraints:
        if c._mask is None and c._error is None:
            rows = groups.setdefault((c._words, c.vocab), [])
            if c not in rows:
                rows.append(c)
    for (words, vocab), rows in groups.items():
        buffer = np.empty((len(rows), words), dtype=np.int32)
        address, size = buffer.__array_interface__["data"][0], words * 4
        for r, c in enumerate(rows):
            c.matcher.unsafe_compute_mask_ptr(address + r * size, size)
        bits = np.unpackbits(buffer.view(np.uint8), axis=1, count=vocab, bitorder="little").view(np.bool_)
        for r, c in enumerate(rows):  # the stop ids: a few scalar writes per row
            if c.end is not None:
                bits[r, c.end] = False
            if c._special or c._text:
                complete = c.matcher.is_accepting()
                for i in c._special:
                    bits[r, i] = complete
                if not complete:
                    for i in c._text:
                        bits[r, i] = False
        some = cast("list[bool]", bits.any(axis=1).tolist())
        if len(rows) == 1:
            masks: Sequence[torch.Tensor] = (torch.from_numpy(bits[0]),)
        else:
            masks = torch.from_numpy(bits).unbind(0)  # row views, sharing ``bits``' memory
        for c, mask, ok in zip(rows, masks, some, strict=True):
            if ok:
                c._mask = mask
            else:
                c._set_error()


class Constraint:
    """One request's position in its grammar: which tokens may come next, and whether it is complete.

    ``vocab`` is the sampler's vocabulary (the mask's length); ``stops`` are the ids that end the reply
    (end-of-text, end-of-turn, the request's ``stop_tokens``): each is allowed exactly when the text
    so far is a complete string of the language, whatever the grammar says of it as text.

    A step costs the engine's mask (computed from its token trie: microseconds once the lexer states
    it meets are built), with the other rows of the step (``fill_masks``), and one ``consume``. It
    runs on the thread that samples, between the model's steps (computing it on a worker thread while
    the model runs was measured to cost more in hand-over than the mask it hid: docs/benchmarks.md).
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
        table = engine.table
        self._words = (len(table.tokens) + 31) // 32  # the engine's mask: one bit per table entry
        ends = [s for s in stops if 0 <= s < vocab]
        # stop ids are set here, whatever the engine's mask says of them (it also sets its end-of-text
        # bit where nothing can follow, complete or not): special ones (never text) are allowed exactly
        # where the text is complete, ordinary ones (text to the grammar) only there
        self._special = tuple(s for s in ends if s in table.special)
        self._text = tuple(s for s in ends if s not in table.special)
        self.end = table.eos if table.eos < vocab and table.eos not in ends else None  # never a stop here
        self.tokenizer = tokenizer
        self.consumed = 0
        self.done = self._complete()
        self._mask: torch.Tensor | None = None  # this position's mask, once computed
        self._error: str | None = None  # or why no token may come next
        if not self.done:
            _WAITING.rows[id(self)] = weakref.ref(self)

    def _complete(self) -> bool:
        """Nothing may follow and the text is whole: the reply is complete. (Stopped short of a whole
        text, nothing of this vocabulary can go on: ``allowed()`` raises.)"""
        return bool(self.matcher.is_stopped()) and bool(self.matcher.is_accepting())

    @property
    def accepting(self) -> bool:
        """The text so far is a complete string of the language (the reply may end here)."""
        return bool(self.matcher.is_accepting())

    @property
    def error(self) -> str:
        return str(self.matcher.get_error())

    def _set_error(self) -> None:
        """No token of this vocabulary may come next: keep why, for ``allowed()`` to raise."""
        error = self.error
        self._error = (
            f"the {self.what} allows no token of this vocabulary after "
            f"{self.consumed} generated token(s)" + (f": {error}" if error else "")
        )

    def allowed(self) -> torch.Tensor:
        """The tokens that may come next: a boolean tensor (vocab,), stop ids set where the text is
        complete; computed with every other row of this thread that waits for its mask (read-only:
        it shares memory with theirs).

        Raises ``GptlabError`` when no token of this vocabulary can continue an incomplete text (a
        vocabulary without a character the language needs).
        """
        mask = self._mask
        if mask is None:
            if self._error is None:
                fill_masks([self, *_WAITING.take()])  # and every row of this thread that moved
                mask = self._mask
            if mask is None:
                raise GptlabError(str(self._error))
        return mask

    def consume(self, token: int) -> None:
        """Advance past ``token`` (one the mask allowed; a stop id ends the reply and is not consumed)."""
        if not self.matcher.consume_token(token):
            raise GptlabError(f"the {self.what} does not allow token {token} here: {self.error}")
        self.consumed += 1
        self.done = self._complete()
        self._mask = self._error = None
        if not self.done:  # a complete reply asks for no more masks
            _WAITING.rows[id(self)] = weakref.ref(self)

    def allowed_ids(self, limit: int | None = None) -> list[int]:
        """The ids ``allowed()`` admits, in id order (at most ``limit``): for display."""
        ids = torch.nonzero(self.allowed()).flatten().tolist()
        return [int(i) for i in ids[:limit]]


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
