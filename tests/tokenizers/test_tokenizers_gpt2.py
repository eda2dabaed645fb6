"""GPT-2: ids identical to tiktoken's ``gpt2`` encoding, built offline from the local files."""

from __future__ import annotations

import base64
import functools
import json
import shutil
from pathlib import Path

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptlab.errors import GptlabError
from gptlab.tokenizers import EOT, GPT2Tokenizer, load
from gptlab.tokenizers.patterns import GPT2_PATTERN

tiktoken = pytest.importorskip("tiktoken")

# emoji (with ZWJ), combining marks, CJK, CRLF, long whitespace runs, contractions,
# digits and special-token look-alikes, mixed with arbitrary Unicode
PIECES = ["😀", "👩\u200d👩\u200d👧", "e\u0301", "中文字", "\r\n", "\n\n", "\t", " ", "   ", "'s", "'LL"]
PIECES += ["1234567", EOT, "<|", "é", "\x00", "\ufeff"]
texts = st.lists(
    st.one_of(st.text(max_size=8), st.sampled_from(PIECES), st.integers(1, 200).map(lambda n: " " * n)),
    max_size=25,
).map("".join)

# openai/gpt-2 encoder.py's pattern; ours is tiktoken's faster, equivalent spelling
ORIGINAL_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.cache
def _gpt2(vocab_bpe: Path, encoder_json: Path) -> GPT2Tokenizer:
    return GPT2Tokenizer.from_files(vocab_bpe, encoder_json)


@functools.cache
def _reference(vocab_bpe: Path, encoder_json: Path):
    """tiktoken's own ``gpt2`` encoding, assembled by tiktoken's loader from the same local files."""
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", "")  # read the local files directly, cache nothing
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json)
        )
    # the fields of tiktoken_ext.openai_public.gpt2(), which would download the files
    return tiktoken.Encoding(
        name="gpt2-reference",
        explicit_n_vocab=50257,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT: 50256},
    )


@pytest.fixture
def gpt2(gpt2_files) -> GPT2Tokenizer:
    return _gpt2(*gpt2_files)


@pytest.fixture
def gpt2_python(gpt2) -> GPT2Tokenizer:
    return gpt2.with_backend("python")


@pytest.fixture
def reference(gpt2_files):
    return _reference(*gpt2_files)


@pytest.fixture
def files(gpt2_files):
    return gpt2_files


@pytest.fixture
def shakespeare(shakespeare_path) -> str:
    return shakespeare_path.read_text(encoding="utf-8")


# the fixtures above are constant (cached), so reusing them across examples is safe
FIXED = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture]}


def test_known_ids(gpt2, gpt2_python):
    for tok in (gpt2, gpt2_python):
        assert tok.encode("Hello world") == [15496, 995]
        assert tok.encode("The cat sat on") == [464, 3797, 3332, 319]
        assert tok.vocab_size == 50257
        assert tok.eot_id == 50256
        assert tok.encode(EOT, allowed_special="all") == [50256]
        assert tok.decode([15496, 995, 50256]) == f"Hello world{EOT}"


def test_all_of_tiny_shakespeare_equals_tiktoken(gpt2, gpt2_python, reference, shakespeare):
    expected = reference.encode_ordinary(shakespeare)
    assert gpt2.backend == "tiktoken"
    assert gpt2.encode(shakespeare) == expected
    assert gpt2_python.encode(shakespeare) == expected
    assert gpt2.decode(expected) == shakespeare
    assert gpt2_python.decode(expected) == shakespeare


@settings(max_examples=250, **FIXED)
@given(texts)
def test_hypothesis_text_equals_tiktoken(gpt2, gpt2_python, reference, s):
    expected = reference.encode(s, allowed_special="all")
    assert gpt2.encode(s, allowed_special="all") == expected
    assert gpt2_python.encode(s, allowed_special="all") == expected
    ordinary = reference.encode_ordinary(s)
    assert gpt2.encode(s) == ordinary == gpt2_python.encode(s)
    assert gpt2.decode(ordinary) == s == gpt2_python.decode(ordinary)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_our_pattern_splits_like_the_original_gpt2_pattern(s):
    assert regex.findall(GPT2_PATTERN, s) == regex.findall(ORIGINAL_GPT2_PATTERN, s)


def test_original_pattern_equivalence_on_shakespeare(shakespeare):
    assert regex.findall(GPT2_PATTERN, shakespeare) == regex.findall(ORIGINAL_GPT2_PATTERN, shakespeare)


def test_saved_json_reloads_offline_with_identical_ids(gpt2, tmp_path, shakespeare):
    path = tmp_path / "gpt2.json"
    gpt2.save(path)
    data = json.loads(path.read_text())
    assert data["kind"] == "gpt2" and len(data["ranks"]) == 50256
    assert base64.b64decode(next(k for k, v in data["ranks"].items() if v == 995)) == b" world"
    again = load(path)
    assert isinstance(again, GPT2Tokenizer)
    assert again.special_tokens == {EOT: 50256}
    sample = shakespeare[:50_000] + f"{EOT} 😀"
    assert again.encode(sample, allowed_special="all") == gpt2.encode(sample, allowed_special="all")
    assert again.with_backend("python").encode(sample) == gpt2.encode(sample)


def test_hugging_face_and_tiktoken_file_formats(gpt2, files, tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(files[0], hf / "merges.txt")
    shutil.copy(files[1], hf / "vocab.json")
    rank_dir = tmp_path / "tt"
    rank_dir.mkdir()
    lines = [
        f"{base64.b64encode(t).decode()} {r}" for t, r in sorted(gpt2.ranks.items(), key=lambda kv: kv[1])
    ]
    (rank_dir / "r50k_base.tiktoken").write_text("\n".join(lines) + "\n")
    text = "Hello world, the cat sat on the mat. 😀 ünïcödé\n\n  x"
    expected = gpt2.encode(text)
    assert GPT2Tokenizer.from_dir(hf).encode(text) == expected
    assert GPT2Tokenizer.from_dir(rank_dir).encode(text) == expected
    tt = load(rank_dir / "r50k_base.tiktoken")
    assert tt.encode(text) == expected and tt.eot_id == 50256
    assert load(files[0].parent).encode(text) == expected


def test_mismatched_or_broken_files_are_clear_errors(files, tmp_path):
    encoder = json.loads(files[1].read_text(encoding="utf-8"))
    encoder["Ġworld"], encoder["Hello"] = encoder["Hello"], encoder["Ġworld"]
    swapped = tmp_path / "encoder.json"
    swapped.write_text(json.dumps(encoder))
    with pytest.raises(GptlabError, match="do not belong together"):
        GPT2Tokenizer.from_files(files[0], swapped)
    del encoder["Ġworld"]
    swapped.write_text(json.dumps(encoder))
    with pytest.raises(GptlabError, match="do not belong together"):
        GPT2Tokenizer.from_files(files[0], swapped)
    bad_merges = tmp_path / "vocab.bpe"
    bad_merges.write_text("#version: 0.2\nĠ t\nthree parts here\n")
    with pytest.raises(GptlabError, match="line 3"):
        GPT2Tokenizer.from_files(bad_merges, files[1])
    with pytest.raises(GptlabError, match="does not exist"):
        GPT2Tokenizer.from_files(tmp_path / "missing.bpe", files[1])
    (tmp_path / "x.tiktoken").write_text("not-base64!! 1\n")
    with pytest.raises(GptlabError, match="line 1"):
        load(tmp_path / "x.tiktoken")
    (tmp_path / "x.tiktoken").write_text("YQ== 0\nYg== 1\n")  # only b"a" and b"b"
    with pytest.raises(GptlabError, match="all 256 single bytes"):
        load(tmp_path / "x.tiktoken")


def test_special_token_text_is_plain_text_unless_allowed(gpt2, reference):
    text = f"a{EOT}b"
    assert 50256 not in gpt2.encode(text)
    assert gpt2.encode(text) == reference.encode(text, disallowed_special=())
    assert gpt2.encode(text, allowed_special={EOT}) == [64, 50256, 65]


def test_streaming_decode_of_a_multibyte_character(gpt2):
    ids = gpt2.encode("😀")
    assert len(ids) > 1  # the emoji is split across tokens
    assert gpt2.decode(ids[:1]) == "\ufffd"
    assert gpt2.decode_bytes(ids) == "😀".encode()
