"""BPE training: the fast trainer learns exactly the merges of a naive one, with a fixed tie rule."""

from __future__ import annotations

from collections import Counter

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab.errors import GptlabError
from gptlab.tokenizers import EOT, BPETokenizer, from_dict
from gptlab.tokenizers.patterns import resolve
from gptlab.tokenizers.training import count_chunks, train_merges


def naive_train(text: str, num_merges: int, pattern: str = "gpt4", specials=(EOT,)) -> list[tuple[int, int]]:
    """Deliberately naive BPE: keep every chunk occurrence, recount every pair after every merge.

    Same rules as the real trainer: most frequent pair; ties -> smallest left id,
    then smallest right id; a pair whose bytes are already a token is never merged.
    """
    for s in specials:
        text = text.replace(s, "\0\0SPLIT\0\0")
    chunks = []
    for part in text.split("\0\0SPLIT\0\0"):
        chunks += [list(c.encode("utf-8")) for c in regex.findall(resolve(pattern), part)]
    vocab = [bytes([i]) for i in range(256)]
    merges: list[tuple[int, int]] = []
    while len(merges) < num_merges:
        counts = Counter(p for chunk in chunks for p in zip(chunk, chunk[1:]))
        allowed = [(-c, p) for p, c in counts.items() if vocab[p[0]] + vocab[p[1]] not in vocab]
        if not allowed:
            break
        _, (a, b) = min(allowed)
        z = len(vocab)
        vocab.append(vocab[a] + vocab[b])
        merges.append((a, b))
        for k, chunk in enumerate(chunks):
            out, i = [], 0
            while i < len(chunk):
                if i + 1 < len(chunk) and chunk[i] == a and chunk[i + 1] == b:
                    out.append(z)
                    i += 2
                else:
                    out.append(chunk[i])
                    i += 1
            chunks[k] = out
    return merges


SHAKESPEARE_HEAD = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.
"""


def fast_train(text, num_merges, pattern="gpt4", specials=(EOT,)):
    return train_merges(count_chunks(text, pattern, specials), num_merges)[0]


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", r"\w+|\s+"])
def test_fast_trainer_equals_naive_trainer(pattern):
    text = SHAKESPEARE_HEAD * 2 + "aaaa bbbb aaaa 1234567 'll 'LL\r\n\r\n  \t\t"
    expected = naive_train(text, 120, pattern)
    assert fast_train(text, 120, pattern) == expected
    assert len(expected) > 100


def test_fast_trainer_equals_naive_trainer_on_shakespeare(shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")[:6000]
    assert fast_train(text, 150) == naive_train(text, 150)


@settings(max_examples=120, deadline=None)
@given(st.text(alphabet="ab c\nxé😀", max_size=150), st.integers(0, 40))
def test_fast_trainer_equals_naive_trainer_on_tie_heavy_text(text, num_merges):
    # a tiny alphabet makes ties, repeated pairs (a a a), and already-known bytes common
    assert fast_train(text, num_merges) == naive_train(text, num_merges)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="aab", min_size=1, max_size=300))
def test_every_token_has_distinct_bytes(text):
    # tiktoken's rank tables need distinct token bytes; the trainer never merges a
    # pair whose bytes are already a token (a safeguard: it has not been seen to trigger)
    merges = fast_train(text, 60, pattern=r"[ab]+")
    vocab = [bytes([i]) for i in range(256)]
    for a, b in merges:
        vocab.append(vocab[a] + vocab[b])
    assert len(set(vocab)) == len(vocab)


def test_tie_rule_smallest_left_then_right_id():
    # every pair occurs once: (32, 99) " c" < (97, 98) "ab" < (99, 100) "cd" by left id
    merges = fast_train("ab cd", 3, pattern="gpt2", specials=())
    assert merges == [(32, 99), (97, 98), (256, 100)]
    # count beats id order
    assert fast_train("zz zz zz ab", 1, pattern="gpt2", specials=())[0] == (122, 122)


def test_training_is_deterministic_and_independent_of_document_order():
    docs = [SHAKESPEARE_HEAD[i : i + 40] for i in range(0, len(SHAKESPEARE_HEAD), 40)]
    a = BPETokenizer.train(docs, 330)
    b = BPETokenizer.train(list(reversed(docs)), 330)
    c = BPETokenizer.train(iter(docs), 330)
    assert a.merges == b.merges == c.merges
    assert len(a.merges) == 330 - 256 - 1


def test_special_tokens_get_the_last_ids_and_are_not_trained_on():
    text = (f"hello world{EOT}" * 50) + "<|pad|>"
    tok = BPETokenizer.train(text, 262, special_tokens=[EOT, "<|pad|>"])
    assert tok.vocab_size == 262
    assert tok.special_tokens == {EOT: 260, "<|pad|>": 261}
    assert tok.eot_id == 260
    assert all(b"<" not in tok.token_bytes(i) and b"|" not in tok.token_bytes(i) for i in range(256, 260))


def test_vocab_is_smaller_when_the_corpus_runs_out_of_pairs():
    tok = BPETokenizer.train("abc", 1000)
    assert tok.merges == [(97, 98), (256, 99)]
    assert tok.vocab_size == 259 and tok.eot_id == 258


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"text_or_iterable": "", "vocab_size": 300}, "empty"),
        ({"text_or_iterable": ["", EOT], "vocab_size": 300}, "empty"),
        ({"text_or_iterable": "abc", "vocab_size": 255, "special_tokens": ()}, r"vocab_size >= 256"),
        (
            {"text_or_iterable": "abc", "vocab_size": 257, "special_tokens": ["<a>", "<b>"]},
            r"vocab_size >= 258",
        ),
        ({"text_or_iterable": "abc", "vocab_size": "300"}, "must be an int"),
        ({"text_or_iterable": "abc", "vocab_size": 300, "pattern": "(a"}, "not a valid regex"),
        ({"text_or_iterable": [b"bytes"], "vocab_size": 300}, "must be a str"),
    ],
)
def test_bad_training_input_is_a_clear_error(kwargs, message):
    with pytest.raises(GptlabError, match=message):
        BPETokenizer.train(**kwargs)


def test_vocab_256_means_bytes_only():
    tok = BPETokenizer.train("hello", 256, special_tokens=())
    assert tok.merges == [] and tok.vocab_size == 256
    assert tok.encode("hé") == [104, 0xC3, 0xA9]


def test_encoding_applies_merges_by_rank():
    tok = BPETokenizer([(97, 98), (256, 99), (98, 99)], pattern="gpt2")
    # "abc": (a,b) has the lowest rank -> ab, then ab+c -> 257
    assert tok.encode("abc") == [257]
    assert tok.with_backend("python").encode("abc") == [257]
    # "bcbc": (b,c) rank 258 merges twice
    assert tok.encode("bcbc") == [258, 258]


def test_trained_tokenizer_compresses_and_round_trips(shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")
    tok = BPETokenizer.train(text[:200_000], 1024)
    ids = tok.encode(text[200_000:300_000])
    assert tok.decode(ids) == text[200_000:300_000]
    assert len(ids) < 0.45 * len(text[200_000:300_000].encode())  # held-out text compresses
    assert tok.with_backend("python").encode(text[200_000:300_000]) == ids
    assert from_dict(tok.to_dict()).encode(text[:5000]) == tok.encode(text[:5000])


def test_custom_pattern_round_trips_and_backends_agree():
    tok = BPETokenizer.train(SHAKESPEARE_HEAD, 300, pattern=r"[a-z]+")
    text = "First Citizen: Hello, WORLD! 😀"
    assert tok.decode(tok.encode(text)) == text
    assert tok.with_backend("python").encode(text) == tok.encode(text)
    assert from_dict(tok.to_dict()).pattern == r"[a-z]+"
