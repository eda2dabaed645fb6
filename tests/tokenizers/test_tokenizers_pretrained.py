"""Pretrained byte-level BPE vocabularies (``PretrainedTokenizer``), the split patterns they name, and
Hugging Face tokenizer files both ways (checked against the ``tokenizers`` library itself)."""

from __future__ import annotations

import random

import pytest
import regex

from gptlab.errors import GptlabError
from gptlab.tokenizers import BPETokenizer, CharTokenizer, PretrainedTokenizer, from_dict
from gptlab.tokenizers.byte_unicode import bytes_to_token
from gptlab.tokenizers.hf_files import hf_tokenizer_json, read_hf_tokenizer, write_hf_tokenizer
from gptlab.tokenizers.patterns import GPT2_PATTERN, split
from gptlab.tokenizers.pretrained import pattern_for

BYTES = [bytes_to_token(bytes([b])) for b in range(256)]
CORPUS = "the cat sat on the mat; the dog ate 1234 bones.\n\tIt's 99 degrees   outside!  " * 20
TEXTS = [
    "the cat sat",
    "It's 2024, x=12345;  y  = 7   8",
    "def f(a):\n    return a ** 2  # ok\n\n\n",
    "   \n\t  spaces  \r\n",
    "naïve café 東京 🤖 émoji",
    "",
]


def _small(pattern: str = "gpt2", drop: bytes = b"") -> PretrainedTokenizer:
    """A vocabulary like real ones: specials first, then the bytes (some absent), then merges in order."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [
        t for b, t in enumerate(BYTES) if b not in drop
    ]
    merges = ["t h", "th e", "Ġ th", "Ġth e", "c a", "ca t", "Ġ ca"]
    tokens += ["th", "the", "Ġth", "Ġthe", "ca", "cat", "Ġca"]
    return PretrainedTokenizer(tokens, merges, special_ids=[0, 1, 2], pattern=pattern, eos_id=2)


def test_merges_give_the_vocabulary_ids():
    tok = _small()
    ids = tok.encode("the cat")
    assert [tok.tokens[i] for i in ids] == ["the", "Ġ", "cat"]  # "ca t" ranks before "Ġ ca"
    assert tok.decode(ids) == "the cat"
    assert tok.encode("<|im_end|>", allowed_special="all") == [2]
    assert 2 not in tok.encode("<|im_end|>")  # not allowed: plain text
    assert tok.eot_id == 2 and tok.stop_ids == [2]


def test_ids_out_of_merge_order_are_refused():
    tokens = BYTES + ["ab", "abc"]
    PretrainedTokenizer(tokens, ["a b", "ab c"])
    with pytest.raises(GptlabError, match="ids in merge order"):
        PretrainedTokenizer(BYTES + ["abc", "ab"], ["a b", "ab c"])
    with pytest.raises(GptlabError, match="not in the vocabulary"):
        PretrainedTokenizer(tokens, ["x y"])
    # the first bad merge is named, whichever its fault
    with pytest.raises(GptlabError, match=r"merge 1 \('x y'\) makes a token that is not"):
        PretrainedTokenizer(BYTES + ["abc", "ab"], ["a b", "x y", "ab c"])


@pytest.mark.parametrize("bad", ["ab", "a  b", " a", "a b c", ["a"], ["a", ""]])
def test_a_malformed_merge_is_named(bad):
    with pytest.raises(GptlabError, match="merge 1 is .*a merge is two tokens"):
        PretrainedTokenizer(BYTES + ["ab"], [["a", "b"], bad])


def test_merges_as_pairs_or_strings_give_one_tokenizer():
    tokens, merges = BYTES + ["ab", "abc"], ["a b", "ab c"]
    as_pairs = PretrainedTokenizer(tokens, [m.split(" ") for m in merges])
    assert as_pairs.ranks == PretrainedTokenizer(tokens, merges).ranks and as_pairs.merges == merges


def test_missing_bytes_are_dropped_and_both_backends_agree():
    tok = _small(drop=b"\x04\xf1")
    text = "a\x04the\U00040001cat"  # U+40001 is F1 80 80 81 in UTF-8
    python = tok.with_backend("python")
    assert tok.backend == "tiktoken"
    assert tok.encode(text) == python.encode(text)
    assert tok.decode(tok.encode(text)) == "athe" + "\ufffd" * 3 + "cat"  # F1 dropped, 80 80 81 kept


def test_round_trip_through_json_keeps_everything():
    tok = _small("gpt2-digits")
    tok.chat_template = "{{ messages[0]['content'] }}"
    back = from_dict(tok.to_dict())
    assert isinstance(back, PretrainedTokenizer)
    assert back.chat_template == tok.chat_template and back.eos_id == 2 and back.pattern == "gpt2-digits"
    for text in TEXTS:
        assert back.encode(text) == tok.encode(text)


def _two_stage(text: str) -> list[str]:
    """Hugging Face's ``Digits(individual_digits=True)`` then GPT-2's ``ByteLevel`` regex, as two splits."""
    out = []
    for piece in regex.split(r"(\p{N})", text):
        out += regex.findall(GPT2_PATTERN, piece) if piece else []
    return out


def test_gpt2_digits_pattern_is_the_two_stage_split():
    rng = random.Random(0)
    alphabet = list("ab 1 2\n\t'sx.,!é") + ["  ", "   ", "'ll", "٣"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert split(text, "gpt2-digits") == _two_stage(text), repr(text)


def test_pre_tokenizer_types():
    assert pattern_for("smollm") == "gpt2-digits" and pattern_for("llama-bpe") == "gpt4"
    with pytest.raises(GptlabError, match="pre-tokenizer type 'weird' is not supported"):
        pattern_for("weird")


# ------------------------------------------------------------------ Hugging Face files
tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers library checks the files we write")


def _hf(tok) -> tokenizers.Tokenizer:
    import json

    return tokenizers.Tokenizer.from_str(json.dumps(hf_tokenizer_json(tok)))


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", "gpt2-digits", "qwen2"])
def test_trained_bpe_written_for_hugging_face_gives_the_same_ids(pattern):
    tok = BPETokenizer.train(CORPUS, vocab_size=330, pattern=pattern)
    hf = _hf(tok)
    for text in [*TEXTS, CORPUS[:200]]:
        assert hf.encode(text).ids == tok.encode(text), (pattern, text)
        assert hf.decode(hf.encode(text).ids) == text
    assert hf.encode("a<|endoftext|>").ids == tok.encode("a<|endoftext|>", allowed_special="all")


def test_pretrained_written_and_read_back(tmp_path):
    tok = _small("gpt2-digits")
    tok.chat_template = "chatml"
    write_hf_tokenizer(tok, tmp_path, model_max_length=64)
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    back = read_hf_tokenizer(tmp_path)
    assert back.eos_id == 2 and "<|im_start|>" in back.chat_template  # the fallback written out in full
    for text in TEXTS:
        assert hf.encode(text).ids == tok.encode(text) == back.encode(text)


def test_char_tokenizer_written_for_hugging_face():
    tok = CharTokenizer.from_text("hello world\n", special_tokens=["<|endoftext|>"])
    hf = _hf(tok)
    assert hf.encode("hello\nworld").ids == tok.encode("hello\nworld")
    assert hf.decode(tok.encode("hold world")) == "hold world"
    assert hf.encode("he<|endoftext|>").ids == tok.encode("he<|endoftext|>", allowed_special="all")
