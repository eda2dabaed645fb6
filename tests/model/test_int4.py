"""int4 weights (``gptlab.quantize(model, "int4")``): torch's CPU int4 kernel against a direct
dequantization, the kernel's packed layout read back, prefill and decode paths, and the checkpoint
round trip."""

from __future__ import annotations

import pytest
import torch

import gptlab
from gptlab.model.int4 import (
    INT4_GROUP,
    Int4Linear,
    Int4Parts,
    int4_supported,
    pack_nibbles,
    quantize_int4,
    unpack_kernel_layout,
    unpack_nibbles,
)
from gptlab.model.quantized import Int8Embedding, Int8Linear

pytestmark = pytest.mark.skipif(not int4_supported(16, 32), reason="this torch has no CPU int4 kernel")


def random_parts(n: int, k: int, seed: int = 0) -> Int4Parts:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    # scales and zeros that bf16 holds exactly, so the kernel's result can be compared tightly
    s = (torch.rand(n, k // INT4_GROUP, generator=g) * 0.02 + 0.001).bfloat16().float()
    z = (torch.randn(n, k // INT4_GROUP, generator=g) * 0.05).bfloat16().float()
    return Int4Parts(q, s, z)


def layer(parts: Int4Parts, bias: bool = False) -> Int4Linear:
    n, k = parts.q.shape
    linear = torch.nn.Linear(k, n, bias=bias)
    return Int4Linear(linear, parts, torch.float32)


@pytest.mark.parametrize("n", [16, 48, 64, 80, 144])  # whole and partial blocks of the kernel's layout
def test_kernel_layout_reads_back_exactly(n):
    parts = random_parts(n, 96, seed=n)
    lin = layer(parts)
    assert torch.equal(unpack_kernel_layout(lin.weight, n, 96), parts.q)
    assert torch.equal(unpack_nibbles(pack_nibbles(parts.q)), parts.q)


@pytest.mark.parametrize("n", [64, 80, 144])  # whole and partial blocks of the kernel's layout
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_dequantised_matrix_is_each_weight_rounded_once(n, dtype):
    """What a prefill multiplies: ``(q − 8)·s + z`` computed exactly, rounded once to ``dtype``."""
    parts = random_parts(n, 96, seed=n)
    w = layer(parts).dequantized(dtype)
    assert w.shape == (n, 96) and w.dtype == dtype
    assert torch.equal(w, parts.dequantize().to(dtype))


@pytest.mark.parametrize("block", [64, 32])  # AVX-512's and AVX2's blocked layouts
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_compiled_dequantisation_gives_the_same_weights(block, dtype, monkeypatch):
    """The form a compiled prompt pass dequantises in (``_blocks_dequantized``: contiguous reads that
    inductor vectorizes) gives eager's ``dequantized`` bit for bit, in either blocked layout; under
    ``torch.compiler.is_compiling()`` ``dequantized`` takes it."""
    from gptlab.model.int4 import _blocks_dequantized, _repack, kernel_scales

    n, k = 192, 96  # three blocks of 64 or six of 32
    parts = random_parts(n, k, seed=block)
    exact = parts.dequantize().to(dtype)  # (N, K)
    packed = _repack(pack_nibbles(parts.q), block, True)
    assert torch.equal(_blocks_dequantized(packed, kernel_scales(parts), n, k, block, dtype).t(), exact)
    lin = layer(parts)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert torch.equal(lin.dequantized(dtype), exact)


@pytest.mark.parametrize("layout", [(64, True), (32, True), (64, False), (32, False)])
def test_every_packed_layout_unpacks_to_its_rows(layout):
    """The layouts ``kernel_layout`` tells apart (AVX-512 and AVX2 blocks), read as (K, N): byte
    (k, j) of a block of B rows holds rows j and j + B/2 (blocked) or 2j and 2j + 1; a last partial
    block holds pairs."""
    from gptlab.model.int4 import _unpack

    block, blocked = layout
    n, k = 2 * block + 16, 64
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(block))
    full = n // block * block
    qt = q[:full].view(full // block, block, k).transpose(1, 2)  # (blocks, K, B)
    lo, hi = (qt[..., : block // 2], qt[..., block // 2 :]) if blocked else (qt[..., 0::2], qt[..., 1::2])
    tail = q[full:].t()  # (K, rows left) in pairs
    packed = torch.cat([(lo | hi << 4).reshape(-1), (tail[:, 0::2] | tail[:, 1::2] << 4).reshape(-1)])
    assert torch.equal(_unpack(packed, n, k, block, blocked), q.t())


@pytest.mark.parametrize("layout", [(64, True), (32, True), (64, False), (32, False)])
@pytest.mark.parametrize("n", [16, 48, 80, 576, 1536 + 16])
def test_repacking_a_checkpoints_nibbles_gives_the_kernels_layout(layout, n):
    """A checkpoint's portable nibbles go to the kernel's layout byte for byte as
    ``_convert_weight_to_int4pack_for_cpu`` lays out q on this CPU, and read back (``_unpack``) to q in
    every layout, with whole blocks, a partial one, or only pairs."""
    from gptlab.model.int4 import _repack, _unpack, kernel_layout

    k = 96
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    packed = _repack(pack_nibbles(q), *layout)
    assert packed.shape == (n, k // 2) and packed.dtype == torch.uint8
    assert torch.equal(_unpack(packed, n, k, *layout), q.t())
    if layout == kernel_layout():
        aten = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        assert torch.equal(packed, aten)


@pytest.mark.parametrize("layout", [(64, True), (32, True), (64, False), (32, False)])
@pytest.mark.parametrize("n", [16, 48, 80, 576, 1536 + 16])
def test_a_token_tables_rows_are_gathered_from_every_packed_layout(layout, n):
    """``Int4Embedding`` reads row x straight from the kernel's bytes (``_row_bytes``): in every layout,
    whole blocks, a partial one or only pairs, the nibbles it gathers are the row's, in any order of ids."""
    from gptlab.model.int4 import _repack, _row_bytes

    k = 96
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    packed = _repack(pack_nibbles(q), *layout).reshape(-1)
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    offsets, shift = _row_bytes(rows, n, k, *layout)
    assert torch.equal((packed[offsets] >> shift) & 15, q[rows])


def test_an_int4_token_table_gives_its_tied_heads_rows_in_the_activations_dtype():
    from gptlab.model.int4 import Int4Embedding

    parts = quantize_int4(torch.randn(80, 64))
    for dtype in (torch.bfloat16, torch.float32):
        table = Int4Embedding.from_parts(parts, dtype)
        ids = torch.tensor([[79, 0, 64, 3], [17, 17, 65, 40]])
        assert table(ids).dtype == dtype and table(ids).shape == (2, 4, 64)
        assert torch.equal(table(ids), table.head().dequantized(dtype)[ids])
        want = parts.dequantize()[ids]  # up to the bf16 scales and zeros (8 significant bits)
        assert (table(ids).float() - want).abs().max() <= 2**-7 * want.abs().max()


@pytest.mark.parametrize("n", [80, 128, 304])
def test_an_int8_matrix_in_blocks_is_exact_as_two_int4_planes(n):
    """``q8_planes``: ``w = d·q`` (int8 q, one scale per block of 32) as an int4 matrix of 2K inputs,
    ``q = 16·h + l``: the table's rows and the head's dequantized matrix are ``q·d`` rounded once, and
    the kernel's product over ``[x, x]`` is ``x·Wᵀ`` up to its bf16 rows; q = −128 and 127 included. (128
    rows: whole blocks of the kernel's layout, dequantized from the packed bytes; 80 and 304 end in a
    partial block, unpacked first.)"""
    from gptlab.model.int4 import Int4Embedding, q8_planes

    g = torch.Generator().manual_seed(n)
    q = torch.randint(-128, 128, (n, 96), dtype=torch.int8, generator=g)
    q[0, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    d = (torch.rand(n, 3, generator=g) * 0.01).to(torch.bfloat16).float()  # scales the kernel holds
    w = q.float() * d.repeat_interleave(32, 1)
    for dtype in (torch.bfloat16, torch.float32):
        table = Int4Embedding.from_parts(q8_planes(q, d), dtype)
        assert table.embedding_dim == 96
        ids = torch.randint(0, n, (2, 7), generator=g)
        assert torch.equal(table(ids), w[ids].to(dtype))
        head = table.head()
        assert head.in_features == 96 and torch.equal(head.dequantized(dtype), w.to(dtype))
        x = torch.randn(2, 96, dtype=dtype, generator=g)
        ref = x.to(torch.bfloat16).float() @ w.t()
        assert (head(x[:1]).float() - ref[:1]).abs().max() <= 1e-2 * ref.abs().max()


@pytest.mark.parametrize(
    "rows", [1, 3, 128 + 5]
)  # the int4 kernel, then the float GEMM (from 96 or 128 rows)
def test_kernel_equals_the_direct_dequantization(rows):
    parts = random_parts(64, 128)
    lin = layer(parts, bias=True)
    with torch.no_grad():
        lin.bias.copy_(torch.randn(64))  # type: ignore[union-attr]
    x = torch.randn(rows, 128).bfloat16().float()
    w = parts.dequantize()  # (q − 8)·s + z, float32
    ref = x @ w.t() + lin.bias
    with torch.no_grad():
        y = lin(x)
    # bf16 output (kernel) or bf16 weights (prefill): a few parts in 2⁸ of the largest value
    assert (y - ref).abs().max() <= 0.02 * ref.abs().max()
    assert y.shape == (rows, 64) and y.dtype == torch.float32


def test_float_weights_quantize_to_groups_within_half_a_step():
    w = torch.randn(32, 64)
    parts = quantize_int4(w)
    err = (parts.dequantize() - w).abs().reshape(32, 2, 32)
    step = parts.scales[..., None]
    assert (err <= step / 2 + 1e-6).all()
    assert parts.q.max() <= 15 and set(parts.q.unique().tolist()) >= {0, 15}
    const = quantize_int4(torch.full((16, 32), 0.25))  # a constant group: exact
    assert torch.equal(const.dequantize(), torch.full((16, 32), 0.25))


def test_unsupported_shapes_fall_back_to_int8(tiny_model):
    model = gptlab.quantize(tiny_model(n_embd=48), "int4")  # K = 48: not a whole number of groups
    mlp = model.blocks[0].mlp
    assert isinstance(model.blocks[0].attn.qkv, Int8Linear) and isinstance(mlp.fc, Int8Linear)
    assert isinstance(mlp.proj, Int4Linear)  # K = 4·48 = 192: six groups
    model = gptlab.quantize(tiny_model(n_embd=64), "int4")
    assert isinstance(model.blocks[0].attn.qkv, Int4Linear) and isinstance(model.lm_head, Int8Linear)
    assert isinstance(model.wte, Int8Embedding)


def test_int4_model_follows_the_float_model_and_survives_a_checkpoint(tiny_model, tmp_path):
    ref = tiny_model(n_embd=64, pos="rope", jitter=0.02)
    model = gptlab.quantize(tiny_model(n_embd=64, pos="rope", jitter=0.02), "int4")
    assert model.quantization == "int4"
    ids = torch.randint(0, 61, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = ref(ids)[0], model(ids)[0]
    assert (got.float() - want).abs().max() < 0.2 * want.abs().max()  # 16 levels of random weights
    gptlab.save(model, None, tmp_path / "ckpt")
    again, _ = gptlab.load(tmp_path / "ckpt")
    assert again.quantization == "int4" and isinstance(again.blocks[1].mlp.fc, Int4Linear)
    with torch.no_grad():
        assert torch.equal(again(ids)[0], got)
        one = ids[:, :1]
        assert torch.equal(again(one)[0], model(one)[0])  # the one-row kernel too
    with pytest.raises(gptlab.GptlabError, match="already int4"):
        gptlab.quantize(model, "int8")


def test_greedy_decoding_of_a_reloaded_int4_model_is_unchanged(tiny_model, char_tok, tmp_path):
    from gptlab.generate.driver import generate_ids

    model = gptlab.quantize(tiny_model(n_embd=64, jitter=0.02), "int4")
    gptlab.save(model, char_tok, tmp_path / "ckpt")
    again, _ = gptlab.load(tmp_path / "ckpt")
    prompt = torch.tensor([char_tok.encode("To be")])
    a = generate_ids(model, prompt, 12, temperature=0.0)
    b = generate_ids(again, prompt, 12, temperature=0.0)
    assert a.shape == (1, prompt.size(1) + 12) and torch.equal(a, b)


@pytest.mark.slow  # a cold compile of the decode step: 20-60 s on 2 busy cores
def test_compiled_int4_step_agrees_with_the_layer_by_layer_step(monkeypatch):
    from gptlab.compiling import can_compile
    from tests.generate._fused import fused_model, greedy_logits

    if not can_compile("cpu"):
        pytest.skip("no C++ compiler for torch.compile")
    model = fused_model("int4")
    assert isinstance(model.blocks[0].attn.qkv, Int4Linear)
    fused = greedy_logits(model, [3, 1, 4, 1, 5], 8, True, monkeypatch)
    layered = greedy_logits(model, [3, 1, 4, 1, 5], 8, False, monkeypatch)
    for a, b in zip(fused, layered, strict=True):
        assert (a - b).abs().max() <= 2e-2 * b.abs().max()
        assert a.argmax() == b.argmax()
