"""gptlab tokenizers → GGUF ``tokenizer.*`` metadata that llama.cpp tokenizes to the same ids.

* ``CharTokenizer`` → llama.cpp's RWKV-type vocabulary (``tokenizer.ggml.model = "rwkv"``): the
  longest token matching the text's next bytes, which for one token per character is that character.
  Its tokens are escaped text (``rwkv_escape``). Unlike a SentencePiece vocabulary, whose default
  bos/eos/unk ids are 1/2/0 (here: ordinary characters, so generation would stop at the character
  of id 2), it has no default special ids.
* byte-level BPE (``BPETokenizer``, ``GPT2Tokenizer``: ``tokenizer.ggml.model = "gpt2"``): tokens
  spelled in GPT-2's byte alphabet, and merges. gptlab merges by the rank of the *joined* token
  (tiktoken's rule); llama.cpp merges by the rank of the *pair*. Writing, for each token in rank
  order, every split of it into two tokens as a merge makes the two rules agree.
* ``PretrainedTokenizer`` (an imported model's own) → its tokens and merges as they came.

The split pattern becomes a ``tokenizer.ggml.pre`` llama.cpp knows (``PRE_FOR_PATTERN``). Special
tokens are ``CONTROL`` tokens; bos/eos are the source's, else ``<|endoftext|>``; ``add_bos_token`` is
what gptlab's ``encode`` does. Ids past the tokenizer (a model vocabulary padded beyond it) are
``[PAD{i}]`` tokens of type ``UNUSED``, as llama.cpp's converter writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gguf import GGUFWriter, TokenType

from gptlab.errors import GptlabError
from gptlab.tokenizers import BPETokenizer, CharTokenizer, GPT2Tokenizer, PretrainedTokenizer, Tokenizer
from gptlab.tokenizers.byte_unicode import bytes_to_token
from gptlab.tokenizers.ranked import RankedTokenizer

#: gptlab split pattern name → llama.cpp pre-tokenizer with the same chunks.
PRE_FOR_PATTERN = {"gpt2": "gpt-2", "gpt2-digits": "smollm", "gpt4": "llama-bpe", "qwen2": "qwen2"}


@dataclass
class Vocab:
    """What ``write`` puts in the file: tokens by id, their types, merges, special ids, flags."""

    model: str
    tokens: list[str]
    types: list[int]
    merges: list[str] = field(default_factory=list)
    pre: str | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    add_bos: bool = False
    chat_template: str | None = None
    stop_ids: list[int] = field(default_factory=list)


def rwkv_escape(text: str) -> str:
    r"""A token's text as llama.cpp's RWKV vocabulary spells it: backslash, newline, tab, CR escaped.

    >>> rwkv_escape("a\\b\n")
    'a\\\\b\\n'
    """
    return text.translate(RWKV_ESCAPES)


RWKV_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"})


def _char_vocab(tok: CharTokenizer) -> Vocab:
    n, special = tok.vocab_size, set(tok.special_tokens.values())
    texts = [tok.token_bytes(i).decode("utf-8") for i in range(n)]
    tokens = [t if i in special else rwkv_escape(t) for i, t in enumerate(texts)]
    types = [int(TokenType.NORMAL)] * n
    if tok.unk_id is not None:
        types[tok.unk_id] = int(TokenType.UNKNOWN)
    return Vocab("rwkv", tokens, _mark_special(types, tok), unk_id=tok.unk_id)


def _ranked_merges(ranks: dict[bytes, int]) -> list[str]:
    """Every split of every token into two tokens, in the joined token's rank order.

    ``{a: 0, b: 1, c: 2, ab: 3, abc: 4}`` → ``["a b", "ab c"]``.
    """
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda item: item[1]):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append(f"{bytes_to_token(left)} {bytes_to_token(right)}")
    return merges


def _pre(pattern: str) -> str:
    if pattern not in PRE_FOR_PATTERN:
        raise GptlabError(
            f"the tokenizer splits text with a custom pattern, which no llama.cpp pre-tokenizer reproduces; "
            f"export a tokenizer trained with pattern {' or '.join(map(repr, PRE_FOR_PATTERN))}"
        )
    return PRE_FOR_PATTERN[pattern]


def _ranked_vocab(tok: RankedTokenizer) -> Vocab:
    n = tok.vocab_size
    tokens: list[str | None] = [None] * n
    for token, rank in tok.ranks.items():
        tokens[rank] = bytes_to_token(token)
    for text, i in tok.special_tokens.items():
        tokens[i] = text
    filled = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    types = [int(TokenType.NORMAL) if t is not None else int(TokenType.UNUSED) for t in tokens]
    merges = _ranked_merges(tok.ranks)
    return Vocab("gpt2", filled, _mark_special(types, tok), merges=merges, pre=_pre(tok.pattern))


def _pretrained_vocab(tok: PretrainedTokenizer) -> Vocab:
    types = _mark_special([int(TokenType.NORMAL)] * len(tok.tokens), tok)
    return Vocab(
        "gpt2",
        list(tok.tokens),
        types,
        merges=list(tok.merges),
        pre=_pre(tok.pattern),
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
        add_bos=tok.add_bos,
        stop_ids=tok.stop_ids,
    )


def _mark_special(types: list[int], tok: Tokenizer) -> list[int]:
    for i in tok.special_tokens.values():
        types[i] = int(TokenType.CONTROL)
    return types


#: tokenizer class → its GGUF vocabulary (a dict by type, not a chain of isinstance tests).
VOCABS: dict[type[Tokenizer], Callable[..., Vocab]] = {
    CharTokenizer: _char_vocab,
    BPETokenizer: _ranked_vocab,
    GPT2Tokenizer: _ranked_vocab,
    PretrainedTokenizer: _pretrained_vocab,
}


def vocab_of(tok: Tokenizer, n_vocab: int) -> Vocab:
    """The GGUF vocabulary of ``tok`` for a model with ``n_vocab`` rows (padded with ``[PAD{i}]``)."""
    make = VOCABS.get(type(tok))
    if make is None:
        raise GptlabError(
            f"a {type(tok).__name__} cannot be written to GGUF; gptlab exports "
            f"{', '.join(cls.__name__ for cls in VOCABS)}"
        )
    vocab = make(tok)
    if len(vocab.tokens) > n_vocab:
        raise GptlabError(
            f"the tokenizer has {len(vocab.tokens)} ids but the model only {n_vocab} rows; "
            "export the tokenizer the model was trained with"
        )
    for i in range(len(vocab.tokens), n_vocab):
        vocab.tokens.append(f"[PAD{i}]")
        vocab.types.append(int(TokenType.UNUSED))
    seen: dict[str, int] = {}
    for i, token in enumerate(vocab.tokens):
        if token in seen:
            raise GptlabError(
                f"tokens {seen[token]} and {i} are both spelled {token!r}; llama.cpp refuses a vocabulary "
                "with a repeated token"
            )
        seen[token] = i
    end = tok.special_tokens.get("<|endoftext|>")
    vocab.eos_id = vocab.eos_id if vocab.eos_id is not None else end
    vocab.bos_id = vocab.bos_id if vocab.bos_id is not None else end
    vocab.stop_ids = vocab.stop_ids or ([vocab.eos_id] if vocab.eos_id is not None else [])
    template = tok.chat_template
    vocab.chat_template = (
        template if template is not None and ("{{" in template or "{%" in template) else None
    )
    return vocab


def write(writer: GGUFWriter, vocab: Vocab) -> None:
    """The ``tokenizer.*`` keys. ``GGUFWriter.add_array`` skips an empty list, so merges are required
    of a BPE vocabulary here (llama.cpp refuses a ``gpt2`` model without them)."""
    if vocab.model == "gpt2" and not vocab.merges:
        raise GptlabError(
            "the BPE tokenizer has no merges; llama.cpp cannot load a byte-level BPE without them"
        )
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    for setter, value in (
        (writer.add_bos_token_id, vocab.bos_id),
        (writer.add_eos_token_id, vocab.eos_id),
        (writer.add_unk_token_id, vocab.unk_id),
    ):
        if value is not None:
            setter(value)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    if vocab.chat_template is not None:
        writer.add_chat_template(vocab.chat_template)


__all__ = ["PRE_FOR_PATTERN", "VOCABS", "Vocab", "rwkv_escape", "vocab_of", "write"]
