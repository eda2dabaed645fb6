"""Byte-level BPE vocabularies that come with pretrained models (GGUF metadata, ``tokenizer.json``).

Blueprint stage 1: tokenize(s) = [vocab[τ_i] | τ_i ∈ BPE_segment(s, M)], with the model's own
vocabulary and merges M. A source gives

* ``tokens[id]``, spelled in GPT-2's byte alphabet (``"Ġcat"`` is ``b" cat"``);
* ``merges`` ``"Ġ c"`` in priority order (merge ``i`` joins the pair ``i``-th);
* the special tokens (``<|im_start|>``, ``<|im_end|>`` …) with their ids, and which are bos / eos;
* the split pattern (``patterns.py``), chosen by the source's pre-tokenizer type.

Encoding is ``ranked.py``'s rule with rank(token) = its id. That equals Hugging Face's BPE (lowest
merge priority first) when the ids of the merged tokens rise with the merge order, which the
constructor checks, so the Rust back-end (tiktoken) gives the model's ids. Bytes that have no token
(a vocabulary learned from UTF-8 text may lack ``\\x04``) are left out, as Hugging Face's BPE does;
text holding one is encoded by the Python path, which knows how.

    >>> tok = PretrainedTokenizer(["<s>", *[bytes_to_token(bytes([b])) for b in range(256)], "ab"],
    ...                           ["a b"], special_ids=[0], eos_id=0)
    >>> tok.encode("abc"), tok.eot_id
    ([257, 100], 0)
"""

from __future__ import annotations

import codecs
import functools
import operator
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice, repeat
from typing import Any, cast

from gptlab.errors import GptlabError
from gptlab.tokenizers.base import AllowedSpecial, Tokenizer, as_id_list
from gptlab.tokenizers.byte_unicode import byte_to_char, bytes_to_token, spelled_in_alphabet
from gptlab.tokenizers.ranked import RankedTokenizer
from gptlab.tokenizers.string_table import StringTable

#: Special tokens that end an assistant's turn in the chat formats gptlab knows; generation stops there.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>")

#: A source's pre-tokenizer type (GGUF ``tokenizer.ggml.pre``, llama.cpp's names) → split pattern name.
PRE_TOKENIZERS = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "mpt": "gpt2",
    "olmo": "gpt2",
    "jais": "gpt2",
    "smollm": "gpt2-digits",
    "starcoder": "gpt2-digits",
    "refact": "gpt2-digits",
    "codeshell": "gpt2-digits",
    "llama3": "gpt4",
    "llama-v3": "gpt4",
    "llama-bpe": "gpt4",
    "dbrx": "gpt4",
    "smaug-bpe": "gpt4",
    "qwen2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
    "stablelm2": "qwen2",
}


def pattern_for(pre: str | None) -> str:
    """The split pattern of a pre-tokenizer type; an unknown type is a ``GptlabError`` naming it."""
    name = "default" if pre is None else pre
    if name not in PRE_TOKENIZERS:
        raise GptlabError(
            f"pre-tokenizer type {name!r} is not supported; gptlab knows {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    return PRE_TOKENIZERS[name]


def spelled_bytes(token: str) -> bytes:
    """A token's bytes: GPT-2's byte alphabet undone, or its UTF-8 if it is not spelled in that alphabet.

    >>> spelled_bytes("Ġcat"), spelled_bytes("é→")
    (b' cat', b'\\xc3\\xa9\\xe2\\x86\\x92')
    """
    data = spelled_in_alphabet(token)
    return token.encode("utf-8") if data is None else data


def undone_all(table: StringTable, spaces: bool = False) -> list[bytes] | None:
    """``spelled_in_alphabet`` of every string of ``table`` in a few passes over the whole table (decode,
    encode through the alphabet as a codec, cut) instead of a call per string (no object made per
    string but the bytes kept: SmolLM2's tokenizer holds 7.8 MB where it held 14.4); ``spaces``: each string holds one space, which goes (merge ``"Ġ t"`` → ``b" t"``,
    what its parts make). None where some character is outside GPT-2's alphabet (then each string's own
    answer differs)."""
    text = table.joined()
    if spaces:
        text = text.replace(" ", "")
    try:
        data, _ = codecs.charmap_encode(text, "strict", _alphabet_codec())
    except UnicodeEncodeError:
        return None
    at = table.char_starts()  # each character one byte now
    if spaces:
        at = array("Q", map(operator.sub, at, range(len(at))))  # one character fewer each
    return list(map(data.__getitem__, map(slice, at, islice(at, 1, None))))


@functools.cache
def _alphabet_codec() -> Any:
    """GPT-2's byte alphabet as a charmap codec: its character for byte ``b`` encodes to ``b``."""
    table = byte_to_char()
    return codecs.charmap_build("".join(table[b] for b in range(256)))


def _merged_ids(
    merges: Sequence[str | Sequence[str]], ids: Mapping[bytes, int], special: Mapping[str, bytes]
) -> tuple[StringTable, list[int]]:
    """``(merges as "left right" strings, the id of the token each makes)``: ``"Ġ t"`` (or ``["Ġ", "t"]``)
    joins ``b" t"``, the id ``ids`` gives it (-1: none); a malformed merge is a ``GptlabError`` naming it.
    A part's bytes are its spelling undone (``spelled_bytes``; a special token's text, its UTF-8), so no
    object is kept per merge once they are read: they are only looked up."""
    if not isinstance(merges, StringTable) and all(isinstance(m, str) for m in merges):
        merges = StringTable.of(cast(Sequence[str], merges))
    if isinstance(merges, StringTable) and all(spelled_in_alphabet(t) == b for t, b in special.items()):
        made = undone_all(merges, spaces=True) if merges.all_split_once(ord(" ")) else None
        if made is not None:  # (else each merge is read below, and a malformed one named)
            return merges, list(map(ids.get, made, repeat(-1)))
    texts: list[str] | None = None  # made only where a merge is not a "left right" string already
    made_ids: list[int] = []
    spelled = dict(special)  # each part's bytes, while the merges are read (a part recurs ~2×)
    for i, m in enumerate(merges):
        if isinstance(m, str) and m.count(" ") == 1:
            a, _, b = m.partition(" ")
            if not (a and b):
                a, b = _pair(m, i)
        else:
            a, b = _pair(m, i)
            if texts is None:
                texts = [str(x) for x in merges[:i]]
            m = f"{a} {b}"
        if texts is not None:
            texts.append(m)
        left, right = spelled.get(a), spelled.get(b)
        if left is None:
            left = spelled[a] = spelled_bytes(a)
        if right is None:
            right = spelled[b] = spelled_bytes(b)
        made_ids.append(ids.get(left + right, -1))
    if texts is not None:
        return StringTable.of(texts), made_ids
    # every merge was a "left right" string already
    return (
        merges if isinstance(merges, StringTable) else StringTable.of(cast(Sequence[str], merges))
    ), made_ids


def _pair(merge: str | Sequence[str], i: int) -> tuple[str, str]:
    parts = merge.split(" ") if isinstance(merge, str) else list(merge)
    if len(parts) == 2 and parts[0] and parts[1]:
        return parts[0], parts[1]
    if len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
        raise GptlabError(f"merge {i} is {merge!r}; a merge is two tokens, 'left right'")
    return parts[0], parts[1]


class PretrainedTokenizer(RankedTokenizer):
    """A pretrained model's byte-level BPE: its tokens, merges, special tokens, bos/eos and chat template."""

    kind = "pretrained"
    drop_missing_bytes = True

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str | Sequence[str]],
        special_ids: Iterable[int] = (),
        pattern: str = "gpt2",
        bos_id: int | None = None,
        eos_id: int | None = None,
        add_bos: bool = False,
        chat_template: str | None = None,
        backend: str = "auto",
    ) -> None:
        if isinstance(tokens, StringTable):
            bad = not tokens or tokens.has_empty()
        else:
            bad = not tokens or not all(isinstance(t, str) and t for t in tokens)
        if bad:
            raise GptlabError("a pretrained vocabulary must be a non-empty list of non-empty token strings")
        tokens = tokens if isinstance(tokens, StringTable) else StringTable.of(tokens)
        special_ids = sorted(set(special_ids))
        for i in (*special_ids, bos_id, eos_id):
            if i is not None and not (isinstance(i, int) and 0 <= i < len(tokens)):
                raise GptlabError(f"special token id {i!r} is outside the vocabulary (0..{len(tokens) - 1})")
        specials = {tokens[i]: i for i in special_ids}
        special_set = set(specials.values())
        spelled = undone_all(tokens)
        if spelled is None:  # some token is not spelled in GPT-2's alphabet
            spelled = [spelled_bytes(t) for t in tokens]
        for i in special_set:
            spelled[i] = tokens[i].encode("utf-8")
        # {token bytes: its first id}, special tokens left out: reversed, so the first id is written last
        ids = {spelled[i]: i for i in range(len(spelled) - 1, -1, -1) if i not in special_set}
        # merge n joins left + right into the token of rank made_ids[n]; the ranks rise in merge order
        self.merges, made_ids = _merged_ids(merges, ids, {t: spelled[i] for t, i in specials.items()})
        self.tokens = tokens
        if not all(a < b for a, b in zip([-1, *made_ids], made_ids)):
            self._refuse_merges(made_ids)
        ranks = {t: i for i, t in sorted((i, t) for t, i in ids.items() if len(t) == 1)}  # the bytes, by id
        ranks.update((spelled[i], i) for i in made_ids)  # (the token's own bytes object, held once)
        del ids
        super().__init__(ranks, pattern, specials, backend=backend, checked=True)
        self._decode_also(spelled)  # tokens no merge reaches (and duplicates) can still be generated
        self._drop_re = re.compile(b"[" + re.escape(self._drop) + b"]") if self._drop else None
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, bool(add_bos)
        self.chat_template = chat_template

    def _refuse_merges(self, made_ids: list[int]) -> None:
        """The first merge that makes no token of the vocabulary, or an id not above the previous one's."""
        last = -1
        for n, made in enumerate(made_ids):
            if made < 0:
                raise GptlabError(
                    f"merge {n} ({self.merges[n]!r}) makes a token that is not in the vocabulary"
                )
            if made <= last:
                raise GptlabError(
                    f"merge {n} ({self.merges[n]!r}) makes id {made}, not above the previous merge's {last}; "
                    "gptlab needs ids in merge order"
                )
            last = made

    # ------------------------------------------------------------ the source's tokens
    @property
    def eot_id(self) -> int | None:
        """The source's end-of-sequence id (generation stops there), else ``<|endoftext|>``'s."""
        return self.eos_id if self.eos_id is not None else super().eot_id

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_id is None else self.tokens[self.bos_id]

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_id is None else self.tokens[self.eos_id]

    @property
    def stop_ids(self) -> list[int]:
        """Ids that end a reply: eos and the end-of-turn tokens this vocabulary has."""
        ids = [self.special_tokens[t] for t in END_OF_TURN if t in self.special_tokens]
        return sorted({*ids, *([self.eos_id] if self.eos_id is not None else [])})

    # ------------------------------------------------------------------ encoding
    def _has_dropped(self, text: str) -> bool:
        return self._drop_re is not None and self._drop_re.search(text.encode("utf-8")) is not None

    def _encode_ordinary(self, text: str) -> list[int]:
        if self._has_dropped(text):  # tiktoken cannot encode a byte that has no token
            return self._encode_python(text)
        return super()._encode_ordinary(text)

    def encode(self, text: str, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Encode ``text``, BOS first where the source says so (``add_bos``), as its own tokenizer does.

        Special tokens are matched only if in ``allowed_special`` (``"all"`` or a set of them); a
        special token's text that is not allowed is encoded as ordinary text, never as its id.
        ``encode_ordinary`` never adds BOS.
        """
        if isinstance(text, str) and self._has_dropped(text):
            ids = Tokenizer.encode(self, text, allowed_special)
        else:
            ids = super().encode(text, allowed_special)
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return Tokenizer.decode_bytes(self, as_id_list(ids))

    decode_bytes.__doc__ = Tokenizer.decode_bytes.__doc__

    # ----------------------------------------------------------------- save / load
    def _payload(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "tokens": list(self.tokens),
            "merges": list(self.merges),
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "add_bos": self.add_bos,
        }

    @classmethod
    def _from_payload(cls, d: Mapping[str, Any], special_tokens: dict[str, int]) -> PretrainedTokenizer:
        return cls(
            d["tokens"],
            d["merges"],
            special_ids=special_tokens.values(),
            pattern=d["pattern"],
            bos_id=d.get("bos_id"),
            eos_id=d.get("eos_id"),
            add_bos=bool(d.get("add_bos", False)),
        )

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any]) -> PretrainedTokenizer:
        """From GGUF ``tokenizer.*`` metadata (``tokenizer.ggml.model`` must be ``"gpt2"``: byte-level BPE).

        Tokens of type 3 (control) and 4 (user-defined) are the special tokens.
        """
        model = fields.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise GptlabError(
                f"tokenizer model {model!r} is not supported; gptlab reads byte-level BPE ('gpt2') vocabularies"
            )
        tokens, merges = fields.get("tokenizer.ggml.tokens"), fields.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise GptlabError("the file has no tokenizer.ggml.tokens / tokenizer.ggml.merges")
        types = fields.get("tokenizer.ggml.token_type") or []
        return cls(
            tokens,
            merges,
            special_ids=[i for i, t in enumerate(types) if t in (3, 4)],
            pattern=pattern_for(fields.get("tokenizer.ggml.pre")),
            bos_id=fields.get("tokenizer.ggml.bos_token_id"),
            eos_id=fields.get("tokenizer.ggml.eos_token_id"),
            add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=fields.get("tokenizer.chat_template"),
        )


__all__ = ["END_OF_TURN", "PRE_TOKENIZERS", "PretrainedTokenizer", "bytes_to_token", "pattern_for"]


def encode_text(tokenizer: Tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    """``text`` → ids, special tokens written in it matched, as transformers' ``tokenizer(text,
    add_special_tokens=…)``: BOS first exactly when ``add_special_tokens`` and the model has one
    (whatever its source says about adding it by default, ``add_bos``).

    >>> encode_text(tok, "<|im_start|>hi")  # SmolLM2: [1, 6004]
    """
    ids = list(tokenizer.encode(text, allowed_special="all"))
    bos = getattr(tokenizer, "bos_id", None)
    if getattr(tokenizer, "add_bos", False) and ids and ids[0] == bos:
        ids = ids[1:]
    return [bos, *ids] if add_special_tokens and bos is not None else ids
