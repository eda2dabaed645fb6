"""Weights for inference: bf16 and int8 (per output channel, dequantisation fused into the matmul)."""

from __future__ import annotations

import pytest
import torch

import gptlab
from gptlab.errors import GptlabError
from gptlab.evaluate.loss import evaluate_tokens
from gptlab.generate import generate_ids
from gptlab.model import GPT, GPTConfig
from gptlab.model.quantized import Int8Linear
from gptlab.tokenizers import CharTokenizer
from tests._tiny import tiny_model


def test_int8_linear_is_the_dequantised_matmul_and_channel_error_is_bounded():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    q = Int8Linear(linear, dtype=torch.float32)
    x = torch.randn(5, 64)
    dequant = q.weight.float() * q.scales[:, None]
    torch.testing.assert_close(q(x), x @ dequant.T + linear.bias, atol=1e-4, rtol=1e-4)
    step = linear.weight.abs().amax(dim=1, keepdim=True) / 127  # rounding error ≤ half a step per weight
    assert ((dequant - linear.weight).abs() <= step / 2 + 1e-7).all()
    assert q.weight.dtype == torch.int8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(48, 64), (4097, 1024)])  # a layer's matrix, one larger than INT8_SMALL
def test_int8_products_agree_at_every_row_count(dtype, shape):
    """A few rows go through ``_weight_int8pack_mm``, many through the float kernels as ``(x · qᵀ) ⊙ s``
    (``int8_float_rows``): at every row count, on either side of the switch, each row's product is the
    dequantised matrix's, and the same as that row multiplied alone."""
    from gptlab.model.quantized import int8_float_rows

    torch.manual_seed(0)
    n, k = shape
    q = Int8Linear(torch.nn.Linear(k, n, bias=False), dtype=dtype)
    dequant = q.weight.double() * q.scales.double()[:, None]
    switch = int8_float_rows(dtype, n * k)
    for rows in sorted({1, max(1, switch - 1), switch, switch + 7}):
        x = torch.randn(rows, k).to(dtype)
        y = q(x)
        want = x.double() @ dequant.T
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4  # bf16 outputs: 8 significant bits
        torch.testing.assert_close(y.double(), want, atol=tol * want.abs().max().item(), rtol=tol)
        torch.testing.assert_close(
            q(x[-1:]).double(), y[-1:].double(), atol=tol * want.abs().max().item(), rtol=tol
        )


def _perplexity(model: GPT, data: torch.Tensor, block: int) -> float:
    assert model.config.block_size == block
    return evaluate_tokens(model, data.numpy(), batch_size=len(data), bytes_per_token=1.0).perplexity


def test_int8_costs_at_most_one_percent_perplexity_on_a_trained_model(shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")[:120_000]
    tok = CharTokenizer.from_text(text)
    data = torch.tensor(tok.encode(text))
    train, held_out = data[:100_000], data[100_000:]
    torch.manual_seed(0)
    block = 64
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=block, n_layer=2, n_head=4, n_embd=64))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        starts = torch.randint(0, len(train) - block - 1, (16,))
        x = torch.stack([train[s : s + block] for s in starts])
        y = torch.stack([train[s + 1 : s + block + 1] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    fp32 = _perplexity(model, held_out, block)
    assert fp32 < 0.5 * tok.vocab_size  # it learned something
    import copy

    int8 = _perplexity(gptlab.quantize(copy.deepcopy(model), "int8"), held_out, block)
    bf16 = _perplexity(gptlab.quantize(copy.deepcopy(model), "bf16"), held_out, block)
    assert int8 <= 1.01 * fp32, (fp32, int8)
    assert bf16 <= 1.01 * fp32, (fp32, bf16)


def test_quantized_models_generate_and_shrink():
    model = tiny_model(vocab_size=50, block_size=16, n_head=2)
    idx = torch.randint(0, 50, (2, 4))

    def nbytes(m: torch.nn.Module) -> int:
        tensors = {id(t): t for t in [*m.parameters(), *m.buffers()]}
        return sum(t.numel() * t.element_size() for t in tensors.values())

    before = nbytes(model.blocks)
    q = gptlab.quantize(model, "int8")
    assert q is model and nbytes(model.blocks) < 0.35 * before
    assert generate_ids(model, idx, 5, temperature=0).shape == (2, 9)
    with pytest.raises(GptlabError, match="already int8"):
        gptlab.quantize(model, "bf16")
    with pytest.raises(GptlabError, match="choose one of"):
        gptlab.quantize(model, "int3")


# ------------------------------------------------------------- the one-row (decode) kernel
from gptlab.model import quantized as qz  # noqa: E402

FORMATS = {
    "fp32": (qz.FloatLinear, torch.float32, 1e-5),
    "bf16": (qz.PackedBF16Linear, torch.bfloat16, 2e-2),
    "int8": (qz.Int8Linear, torch.bfloat16, 2e-2),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_one_row_kernel_equals_the_batched_product(fmt, compiled_one_row):
    make, act, tol = FORMATS[fmt]
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 1024)
    layer = make(linear)
    layer.streams = True  # what quantize() sets for a model too large for the caches
    x = torch.randn(3, 512).to(act)
    with torch.inference_mode():
        batched = layer(x)  # three rows: the format's batched kernel
        rows = torch.cat([layer(x[i : i + 1]) for i in range(3)])  # one row each: gemv
        manual = qz.gemv(x, layer.weight, layer.scales, layer.bias)  # the equation, uncompiled
    assert rows.dtype == act and rows.shape == (3, 1024)
    scale = batched.float().abs().max()
    assert (rows.float() - batched.float()).abs().max() <= tol * scale
    assert (rows.float() - manual.float()).abs().max() <= tol * scale
    kernel = qz._GEMV[layer.weight.dtype]
    if kernel.enabled:  # a C++ compiler is here: the compiled kernel ran and stayed on
        assert kernel.compiled_calls > 0 and kernel.failure is None


def test_each_weight_format_compiles_its_one_row_kernel_a_few_times_only(monkeypatch, compiled_one_row):
    import torch._dynamo.utils as dynamo_utils

    monkeypatch.setattr(qz, "STREAM_MIN_BYTES", 0)  # a small model, treated as one that streams
    if not qz._GEMV[torch.int8].enabled:
        pytest.skip("no C++ compiler: the one-row kernels are not compiled")
    frames = dynamo_utils.counters["frames"]
    for fmt in ("int8", "bf16", "fp32"):
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=600, block_size=32, n_layer=2, n_head=8, n_embd=512)
        model = gptlab.quantize(GPT(config), fmt)  # five matrix shapes
        idx = torch.randint(0, 600, (1, 5))
        before = frames["ok"]
        for _ in range(2):
            assert generate_ids(model, idx, 4, temperature=0).shape == (1, 9)
        # square and oblong matrices, with and without bias: at most three graphs per format, not
        # one per shape (dynamo allows 8 per code object; past that a kernel would silently run eager)
        assert frames["ok"] - before <= 3, (fmt, frames["ok"] - before)


def test_fp32_inference_keeps_tied_weights_and_checkpoint_names():
    model = tiny_model(vocab_size=50, block_size=16, n_head=2)
    keys = set(model.state_dict())
    gptlab.quantize(model, "fp32")
    assert isinstance(model.lm_head, qz.FloatLinear)
    assert model.lm_head.weight is model.wte.weight
    assert set(model.state_dict()) == keys
    assert gptlab.quantize(model, "int8").quantization == "int8"  # fp32 inference weights convert further


def test_only_models_too_large_for_the_caches_take_the_one_row_kernel(one_row):
    """A model of ``STREAM_MIN_BYTES`` or more streams through the compiled one-row kernel where the
    hardware plan says ``compiled``; where it says ``library`` (native bf16) no layer does."""
    small = gptlab.quantize(tiny_model(vocab_size=50, block_size=16, n_head=2), "fp32")
    assert not any(m.streams for m in small.modules() if isinstance(m, qz.InferenceLinear))
    config = GPTConfig(vocab_size=50, block_size=16, n_layer=12, n_head=8, n_embd=512)  # 151 MB of fp32
    large = gptlab.quantize(GPT(config), "fp32")
    streams = [m.streams for m in large.modules() if isinstance(m, qz.InferenceLinear)]
    assert all(streams) if one_row == "compiled" else not any(streams)


def test_with_the_library_kernels_a_large_model_decodes_without_compiling(monkeypatch):
    """Where the plan says ``library``, a model that streams decodes one row at a time through each
    format's own kernel: dynamo compiles no frame, and each row equals the batched product."""
    import torch._dynamo.utils as dynamo_utils

    from gptlab import hardware

    monkeypatch.setattr(hardware, "one_row_kernel", lambda device, machine=None: "library")
    monkeypatch.setattr(qz, "STREAM_MIN_BYTES", 0)
    frames = dynamo_utils.counters["frames"]
    for fmt in ("fp32", "bf16", "int8"):
        torch.manual_seed(0)
        model = gptlab.quantize(
            GPT(GPTConfig(vocab_size=600, block_size=32, n_layer=2, n_head=8, n_embd=256)), fmt
        )
        before = frames["ok"] + frames["total"]
        assert generate_ids(model, torch.randint(0, 600, (1, 5)), 4, temperature=0).shape == (1, 9)
        assert frames["ok"] + frames["total"] == before, fmt


def test_without_a_compiled_kernel_one_row_uses_the_library_kernel(monkeypatch, compiled_one_row):
    torch.manual_seed(0)
    layer = qz.Int8Linear(torch.nn.Linear(256, 512))
    layer.streams = True
    kernel = qz._GEMV[torch.int8]
    monkeypatch.setattr(kernel, "enabled", False)  # no C++ compiler, or GPTLAB_COMPILE=0

    def never(*args):
        raise AssertionError("the uncompiled one-row formula materialises (N, K) floats")

    monkeypatch.setattr(kernel, "fn", never)
    x = torch.randn(4, 256).bfloat16()
    with torch.inference_mode():
        one = layer(x[:1])
        assert (one.float() - layer(x)[:1].float()).abs().max() <= 2e-2 * one.float().abs().max()
