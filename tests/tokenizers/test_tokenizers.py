"""Tokenizers: round trips, special tokens, bad input, save/load (CharTokenizer and the shared base)."""

from __future__ import annotations

import ast
import codecs
import doctest
import functools
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import gptlab.tokenizers
from gptlab.errors import GptlabError
from gptlab.tokenizers import (
    EOT,
    KINDS,
    BPETokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    Tokenizer,
    from_dict,
    load,
)
from gptlab.tokenizers.loading import parse_ids
from gptlab.tokenizers.patterns import PATTERNS, compile_pattern, split
from gptlab.tokenizers.render import render_token, vocab_lines

# Text that stresses tokenizers: emoji (with ZWJ), combining marks, CJK, CRLF,
# long whitespace runs, contractions, digits, and special-token look-alikes.
PIECES = [
    "😀",
    "👩\u200d👩\u200d👧",
    "e\u0301",
    "中文字",
    "\r\n",
    "\n\n",
    "\t",
    " ",
    "   ",
    "'s",
    "'LL",
    "1234567",
    EOT,
    "<|",
    "é",
    "\x00",
    "\ufeff",
]
texts = st.lists(
    st.one_of(st.text(max_size=8), st.sampled_from(PIECES), st.integers(1, 200).map(lambda n: " " * n)),
    max_size=25,
).map("".join)

BPE_CORPUS = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
    "The cat sat on the mat; the cat's hat is 12345 years old.\r\n" * 3
)


@pytest.fixture(scope="module")
def small_bpe() -> BPETokenizer:
    return BPETokenizer.train(BPE_CORPUS, vocab_size=320, special_tokens=[EOT, "<|pad|>"])


# ----------------------------------------------------------------- char tokenizer
def test_char_vocab_is_sorted_alphabet_and_encodes_by_index():
    tok = CharTokenizer.from_text("hello world")
    assert tok.vocab_size == 8
    assert tok.encode("hello") == [3, 2, 4, 4, 5]
    assert tok.decode([3, 2, 4, 4, 5]) == "hello"
    assert tok.eot_id is None


def test_char_unknown_character_names_it_and_its_position():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(GptlabError, match=r"'z' at position 2"):
        tok.encode("abz")


def test_char_unk_fallback_stands_for_unseen_characters():
    tok = CharTokenizer.from_text("abc", unk="<unk>")
    assert tok.unk_id == 3
    assert tok.encode("azb") == [0, 3, 1]
    assert tok.decode(tok.encode("azb")) == "a<unk>b"
    in_vocab = CharTokenizer.from_text("ab?", unk="?")
    assert in_vocab.vocab_size == 3 and in_vocab.unk_id == in_vocab.encode("?")[0]  # the unk is "?" itself
    assert in_vocab.encode("a!") == [in_vocab.encode("a")[0], in_vocab.unk_id]


def test_char_special_tokens_follow_the_alphabet_and_are_stripped_from_the_corpus():
    tok = CharTokenizer.from_text(f"ab{EOT}ba", special_tokens=[EOT])
    assert tok.chars == ["a", "b"]
    assert tok.special_tokens == {EOT: 2} and tok.eot_id == 2
    assert tok.encode(f"a{EOT}b", allowed_special="all") == [0, 2, 1]


@settings(max_examples=150, deadline=None)
@given(texts.filter(bool))
def test_char_round_trip(s):
    tok = CharTokenizer.from_text(s)
    assert tok.decode(tok.encode(s)) == s
    assert tok.decode_bytes(tok.encode(s)) == s.encode("utf-8")
    again = from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.encode(s) == tok.encode(s)


def test_char_empty_corpus_is_an_error():
    with pytest.raises(GptlabError, match="empty"):
        CharTokenizer.from_text("")
    with pytest.raises(GptlabError, match="empty"):
        CharTokenizer.from_text(EOT, special_tokens=[EOT])


# ------------------------------------------------------------- every tokenizer
@pytest.fixture(scope="module")
def every_tokenizer(small_bpe) -> dict[str, Tokenizer]:
    """A tokenizer of each kind that can encode any text (char: with unk)."""
    toks: dict[str, Tokenizer] = {
        "char": CharTokenizer.from_text(BPE_CORPUS + "<|>x", unk="\ufffd", special_tokens=[EOT]),
        "bpe": small_bpe,
        "bpe-python": small_bpe.with_backend("python"),
    }
    return toks


def test_the_backends_part_only_on_letters_newer_than_pythons_unicode(every_tokenizer):
    """Where the engines class a character differently, it is one that Python's own Unicode tables do not
    know yet (category Cn): a letter of a newer Unicode, or a code point a newer ``regex`` calls one.
    On such a character the back-ends may split a text apart (docs/guide/tokenizers.md)."""
    import unicodedata

    bpe, py = every_tokenizer["bpe"], every_tokenizer["bpe-python"]
    apart = engines_disagree_on(bpe.pattern)
    assert all(unicodedata.category(c) == "Cn" for c in apart), sorted(
        c for c in apart if unicodedata.category(c) != "Cn"
    )[:5]
    for c in sorted(apart)[:50]:
        assert bpe.decode(bpe.encode(c + "'s")) == py.decode(py.encode(c + "'s")) == c + "'s"  # both lossless


def test_every_kind_is_registered():
    assert set(KINDS) == {"char", "bpe", "gpt2", "pretrained"}
    assert KINDS["gpt2"] is GPT2Tokenizer


@functools.cache
def engines_disagree_on(pattern: str) -> frozenset[str]:
    """The code points that tiktoken's regex engine and the ``regex`` package put in different classes of
    a split pattern: a letter (or digit) to one, punctuation to the other, seen as whether
    ``c + "'s"`` keeps the contraction whole. Their Unicode tables differ: tiktoken 0.14 has Unicode 16.0;
    ``regex`` 2024.9.11–2025.9.18 the same, 2025.11.3 on 17.0, and 2026.11.19 more (U+3D000–U+3FC3F)."""
    import regex
    import tiktoken

    from gptlab.tokenizers.patterns import resolve

    ranks = {bytes([i]): i for i in range(256)} | {b"'s": 256}
    fast = tiktoken.Encoding("probe", pat_str=resolve(pattern), mergeable_ranks=ranks, special_tokens={})
    split = regex.compile(resolve(pattern))
    chars = (chr(cp) for cp in range(0x80, 0x110000) if not 0xD800 <= cp <= 0xDFFF)
    return frozenset(c for c in chars if (256 in fast.encode(c + "'s")) != ("'s" in split.findall(c + "'s")))


@settings(max_examples=200, deadline=None)
@given(texts)
@example("\u1c89's \ua7cb1")  # letters of Unicode 16.0 (`regex` ≤ 2024.7.24 did not know them)
def test_bpe_round_trip_and_backends_agree(every_tokenizer, s):
    """The two back-ends give the same ids for any text whose characters their regex engines class alike
    (``test_the_backends_part_only_on_letters_newer_than_pythons_unicode``)."""
    bpe, py = every_tokenizer["bpe"], every_tokenizer["bpe-python"]
    ids = bpe.encode(s)
    assert bpe.decode(ids) == s
    assume(not engines_disagree_on(bpe.pattern).intersection(s))
    assert py.encode(s) == ids
    assert all(0 <= i < bpe.vocab_size for i in ids)
    with_special = bpe.encode(s, allowed_special="all")
    assert py.encode(s, allowed_special="all") == with_special
    assert bpe.decode(with_special) == s


@pytest.mark.parametrize("kind", ["char", "bpe", "bpe-python"])
def test_lone_surrogates_are_rejected_with_their_position(every_tokenizer, kind):
    tok = every_tokenizer[kind]
    for text in ["ab\ud800", "\udfff", "x\ud83d\ude00"]:
        with pytest.raises(GptlabError, match=r"surrogate .* at position"):
            tok.encode(text)
        with pytest.raises(GptlabError, match="surrogate"):
            tok.encode_ordinary(text)


def test_surrogates_are_rejected_when_building():
    with pytest.raises(GptlabError, match="surrogate"):
        CharTokenizer.from_text("a\ud800")
    with pytest.raises(GptlabError, match="surrogate"):
        BPETokenizer.train("a\ud800b", vocab_size=300)


@pytest.mark.parametrize("kind", ["char", "bpe", "bpe-python"])
def test_special_tokens_are_never_matched_by_accident(every_tokenizer, kind):
    tok = every_tokenizer[kind]
    text = f"the cat{EOT}sat"
    plain = tok.encode(text)
    assert tok.eot_id not in plain
    assert tok.decode(plain) == text
    allowed = tok.encode(text, allowed_special={EOT})
    assert allowed.count(tok.eot_id) == 1
    assert allowed == tok.encode("the cat") + [tok.eot_id] + tok.encode("sat")
    assert tok.encode(text, allowed_special="all") == allowed
    assert tok.encode_ordinary(text) == plain


def test_allowed_special_must_name_known_special_tokens(small_bpe):
    with pytest.raises(GptlabError, match="does not have"):
        small_bpe.encode("x", allowed_special={"<|nope|>"})
    with pytest.raises(GptlabError, match="'all'"):
        small_bpe.encode("x", allowed_special="none")


def test_several_special_tokens_longest_first(small_bpe):
    ids = small_bpe.encode(f"a<|pad|>{EOT}<|pad|", allowed_special="all")
    assert ids.count(small_bpe.special_tokens["<|pad|>"]) == 1
    assert ids.count(small_bpe.eot_id) == 1
    assert small_bpe.decode(ids) == f"a<|pad|>{EOT}<|pad|"


@pytest.mark.parametrize("kind", ["char", "bpe", "bpe-python"])
def test_decode_rejects_ids_outside_the_vocabulary(every_tokenizer, kind):
    tok = every_tokenizer[kind]
    for bad in ([tok.vocab_size], [0, -1], [0, "1"], [1.5]):
        with pytest.raises(GptlabError, match="not in the vocabulary"):
            tok.decode(bad)
        with pytest.raises(GptlabError, match="not in the vocabulary"):
            tok.decode_bytes(bad)
    with pytest.raises(GptlabError, match="position 2"):
        tok.decode([0, 0, tok.vocab_size + 5])


def test_decode_accepts_iterators_and_numpy_arrays(small_bpe):
    np = pytest.importorskip("numpy")
    ids = small_bpe.encode("the cat sat")
    assert small_bpe.decode(iter(ids)) == "the cat sat"
    assert small_bpe.decode(np.array(ids, dtype=np.int64)) == "the cat sat"
    assert small_bpe.decode(tuple(ids)) == "the cat sat"


def test_decode_bytes_streams_through_an_incremental_utf8_decoder(small_bpe):
    text = "héllo 😀 中文"
    ids = small_bpe.encode(text)
    pieces = [small_bpe.token_bytes(i) for i in ids]
    assert any(p.decode("utf-8", errors="replace") != p.decode("utf-8", errors="ignore") for p in pieces)
    decoder = codecs.getincrementaldecoder("utf-8")()
    assert "".join(decoder.decode(p) for p in pieces) + decoder.decode(b"", final=True) == text
    assert small_bpe.decode([0xE4]) == "\ufffd"  # half a character -> U+FFFD


def test_token_bytes(small_bpe):
    assert small_bpe.token_bytes(ord("a")) == b"a"
    assert small_bpe.token_bytes(small_bpe.eot_id) == EOT.encode()
    assert small_bpe.token_bytes(256) == bytes.join(b"", map(small_bpe.token_bytes, small_bpe.merges[0]))
    with pytest.raises(GptlabError):
        small_bpe.token_bytes(10**6)


@pytest.mark.parametrize("bad", [-1, 10**6, 1.0, "1", None])
def test_token_bytes_takes_numpy_ids_and_names_a_bad_one(small_bpe, bad):
    """An id from a numpy array is an id; a negative, too large, float or text one is refused by name,
    from ``token_bytes`` and from ``decode`` alike (never read from the end of the table)."""
    import numpy as np

    assert small_bpe.token_bytes(np.int64(ord("a"))) == b"a"
    for fail in (lambda: small_bpe.token_bytes(bad), lambda: small_bpe.decode([97, bad])):
        with pytest.raises(GptlabError, match=f"token id {re.escape(repr(bad))} at position"):
            fail()
    with pytest.raises(GptlabError, match="token id True at position 0"):
        small_bpe.token_bytes(True)


def test_encode_rejects_non_strings(small_bpe):
    with pytest.raises(GptlabError, match="must be a str"):
        small_bpe.encode(b"bytes")


# ------------------------------------------------------------------ save, load
@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_save_load_round_trip(every_tokenizer, kind, tmp_path):
    tok = every_tokenizer[kind]
    path = tmp_path / "tok.json"
    tok.save(path)
    data = json.loads(path.read_text())
    assert data["kind"] == kind and data["version"] == 1 and data["format"] == "gptlab-tokenizer"
    again = load(path)
    assert type(again) is type(tok)
    assert again.vocab_size == tok.vocab_size and again.special_tokens == tok.special_tokens
    text = BPE_CORPUS + f"{EOT} ü"
    assert again.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_bpe_file_keeps_pattern_and_merges(small_bpe, tmp_path):
    small_bpe.save(tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["pattern"] == "gpt4"
    assert [tuple(m) for m in data["merges"]] == small_bpe.merges
    assert data["special_tokens"] == {EOT: 318, "<|pad|>": 319}


CORRUPTIONS = {
    "truncated": lambda s: s[: len(s) // 2],
    "not json": lambda s: "hello",
    "a list": lambda s: "[1, 2]",
    "not utf-8": lambda s: "\udcff",
    "unknown kind": lambda s: s.replace('"kind": "bpe"', '"kind": "wordpiece"'),
    "future version": lambda s: s.replace('"version": 1', '"version": 99'),
    "merge of a future id": lambda s: s.replace('"merges": [\n    [', '"merges": [\n    [9999, 1], ['),
    "merge not a pair": lambda s: s.replace('"merges": [\n    [', '"merges": [\n    [1], ['),
    "no merges": lambda s: s.replace('"merges"', '"mergez"'),
    "special clashes with a merge": lambda s: s.replace('"<|endoftext|>": 318', '"<|endoftext|>": 300'),
    "bad pattern": lambda s: s.replace('"pattern": "gpt4"', '"pattern": "(unclosed"'),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_tokenizer_file_is_a_clear_error(small_bpe, tmp_path, name):
    path = tmp_path / "tok.json"
    small_bpe.save(path)
    corrupted = CORRUPTIONS[name](path.read_text())
    path.write_bytes(corrupted.encode("utf-8", errors="surrogateescape"))
    with pytest.raises(GptlabError, match="tok.json"):
        load(path)


def test_missing_tokenizer_file_names_it(tmp_path):
    with pytest.raises(GptlabError, match=r"nope\.json.*does not exist"):
        load(tmp_path / "nope.json")
    with pytest.raises(GptlabError, match="no tokenizer files"):
        load(tmp_path)  # a folder without GPT-2 files


# ----------------------------------------------------------------- small parts
def test_patterns_are_chosen_by_name_and_custom_patterns_lose_nothing():
    assert set(PATTERNS) == {"gpt2", "gpt4", "gpt2-digits", "qwen2"}
    assert split("Hello world's 12345", "gpt4") == ["Hello", " world", "'s", " ", "123", "45"]
    assert split("Hello world's 12345", "gpt2") == ["Hello", " world", "'s", " 12345"]
    assert "".join(split("a-b c!", r"\w+")) == "a-b c!"
    for bad in ["(unclosed", "(a)", "x*", ""]:
        with pytest.raises(GptlabError):
            compile_pattern(bad)


def test_render_token_escapes_controls_and_partial_bytes():
    assert render_token(b" the\n") == " the\\n"
    assert render_token(b"\xe2\x82") == "\\xe2\\x82"
    assert render_token("\x00\u200b\\é".encode()) == "\\x00\\u200b\\\\é"
    assert all("\n" not in line for line in vocab_lines(CharTokenizer.from_text("a\nb\t")))


def test_parse_ids():
    assert parse_ids("1 2\n3") == parse_ids("[1, 2, 3]") == parse_ids("1,2,3") == [1, 2, 3]
    with pytest.raises(GptlabError, match="'x' is not a token id"):
        parse_ids("1 x")


@pytest.mark.parametrize(
    "module", ["base", "bpe", "byte_unicode", "char", "loading", "patterns", "ranked", "render", "training"]
)
def test_docstring_examples_hold(module):
    mod = importlib.import_module(f"gptlab.tokenizers.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_tokenizer_modules_never_import_torch():
    package = Path(gptlab.tokenizers.__file__).parent
    for path in [*package.glob("*.py"), package.parent / "cli" / "tokenizer.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "torch" for n in names), f"{path.name} imports torch"
            assert not any(n.startswith(("gptlab.model", "gptlab.train")) for n in names), path.name


def test_package_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None; import gptlab.tokenizers; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1]


@given(st.binary(max_size=40))
def test_byte_table_round_trips_every_byte_string(data):
    from gptlab.tokenizers.byte_unicode import bytes_to_token, spelled_in_alphabet, token_to_bytes

    token = bytes_to_token(data)
    assert token_to_bytes(token) == data == spelled_in_alphabet(token)


@pytest.mark.parametrize("char", [" ", "\x00", "\n", "€", "\u0144"])  # raw space/controls; above the table
def test_byte_table_rejects_characters_outside_it(char):
    from gptlab.tokenizers.byte_unicode import spelled_in_alphabet, token_to_bytes

    assert spelled_in_alphabet(f"Ġa{char}b") is None
    with pytest.raises(GptlabError, match=re.escape(f"character {char!r}")):
        token_to_bytes(f"Ġa{char}b")
