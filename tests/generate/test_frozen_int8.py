"""A kept step with int8 matrices freezes them (``gptlab.generate.one_token``): inductor's GEMM template
packs each into blocks of columns, and a later process makes those blocks again from the model's own.

Properties: the blocked layout is ``P[j, k, i] = W[j·b + i, k]``, zero past row N; a packed constant is
traced back to the one model tensor whose blocks it equals, by value (a constant matching none is an
error, not a guess); the step freezes exactly where the library kernel multiplies the int8 row; and in
a compiled step that kernel gives the eager step's product bit for bit. The whole path (compiled,
stored, loaded in another process, greedy tokens equal) is in test_compile_store.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gptlab
from gptlab.generate.one_token import _recipes, blocked, frozen_int8
from gptlab.model.quantized import Int8Linear, activation_dtype
from tests._tiny import tiny_model


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 70), k=st.integers(1, 40), block=st.sampled_from([1, 4, 16, 32, 64]))
def test_blocks_hold_each_weight_where_the_layout_says(n, k, block):
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    p = blocked(w, block)
    rows = -(-n // block)
    assert p.shape == (rows, k, block) and p.is_contiguous() and p.dtype == torch.int8
    j, kk, i = torch.meshgrid(torch.arange(rows), torch.arange(k), torch.arange(block), indexing="ij")
    inside = j * block + i < n
    assert torch.equal(p[inside], w[(j * block + i)[inside], kk[inside]])
    assert not p[~inside].any()  # the padding past row N is zero


def test_a_packed_constant_is_traced_to_the_tensor_it_was_made_from():
    torch.manual_seed(0)
    a, b = (torch.randint(-127, 128, (40, 24), dtype=torch.int8) for _ in range(2))
    b[0] = a[0]  # same first row: the cheap test passes, the full comparison decides
    own = {"m.a.weight": a, "m.b.weight": b, "m.norm.weight": torch.ones(24)}
    made = {"constant7": blocked(b, 16), "constant8": blocked(a, 32)}
    names = ["m.norm.weight", "constant7", "constant8"]
    assert _recipes(names, made, own) == {"constant7": ["m.b.weight", 16], "constant8": ["m.a.weight", 32]}


@pytest.mark.parametrize(
    "made",
    [
        {},  # a constant nobody recorded
        {"constant7": torch.zeros(40, 24, dtype=torch.int8)},  # not blocked
        {"constant7": blocked(torch.randint(-127, 128, (40, 24), dtype=torch.int8), 16)},  # of no own tensor
    ],
)
def test_a_constant_that_matches_no_model_tensor_is_an_error(made):
    own = {"m.a.weight": torch.randint(-127, 128, (40, 24), dtype=torch.int8)}
    with pytest.raises(ValueError, match="constant7"):
        _recipes(["constant7"], made, own)


def _tiny():
    return tiny_model(vocab_size=61, n_layer=2, n_head=4, n_embd=32, pos="rope", norm="rmsnorm")


def test_the_step_freezes_where_the_library_kernel_multiplies_int8_rows():
    bf16_rows = activation_dtype("cpu") == torch.bfloat16  # native bf16: the library kernels
    assert frozen_int8(gptlab.quantize(_tiny(), "int8")) == bf16_rows
    assert frozen_int8(gptlab.quantize(_tiny(), "int4")) == bf16_rows  # its head is int8
    assert not frozen_int8(_tiny())
    assert not frozen_int8(gptlab.quantize(_tiny(), "bf16"))
    streaming = gptlab.quantize(_tiny(), "int8")
    for m in streaming.modules():
        if isinstance(m, Int8Linear):
            m.streams = True  # a CPU below native bf16: the compiled reduction, nothing to freeze
    assert not frozen_int8(streaming)


@pytest.mark.skipif(
    activation_dtype("cpu") != torch.bfloat16, reason="int8 rows run as bf16 only where bf16 is native"
)
def test_a_compiled_int8_row_is_the_library_kernels_product():
    """Not frozen (no store), the compiled step calls the kernel the eager step calls: equal bits."""
    layer = next(m for m in gptlab.quantize(_tiny(), "int8").modules() if isinstance(m, Int8Linear))
    x = torch.randn(1, layer.in_features).to(torch.bfloat16)
    compiled = torch.compile(layer._compiled_row, dynamic=False)
    with torch.no_grad():
        assert torch.equal(compiled(x), layer._matmul(x))
