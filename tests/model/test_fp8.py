"""FP8 training products (gptlab.model.fp8): the scaling, the layouts ``_scaled_mm`` needs, forward and
backward against a float32 reference within FP8's precision, ``torch.compile(fullgraph=True)``, the
layer swap by group name, and a tiny model that learns like the bf16 one.

``torch._scaled_mm`` runs on this CPU build (a slow reference kernel), so these tests exercise the
real function; the one test of the GPU kernel needs a CUDA GPU of capability ≥ 8.9.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from gptlab.errors import GptlabError
from gptlab.model import GPT, GPTConfig, build_model
from gptlab.model.fp8 import (
    E4M3,
    E5M2,
    FP8_MAX,
    WGRAD,
    FP8Linear,
    check_device,
    column_major,
    dequantize,
    enable_fp8,
    fp8_linear,
    quantize,
    scaled_mm,
)
from gptlab.train.config import TrainConfig
from gptlab.train.precision import loss_impl

HAS_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=60, vocab_multiple=64)


#: The CPU reference kernel of ``torch._scaled_mm`` (oneDNN) on a CPU of torch capability AVX2: in a
#: process that ran other matmuls first it fails with "could not create a primitive descriptor for the
#: matmul primitive" (torch 2.13; seen with AVX2 imitated, ``ONEDNN_MAX_CPU_ISA=AVX2``, where the same
#: test passes alone). FP8 itself is refused on a CPU (``check_device``), so only these reference tests
#: need the kernel; they run on AVX-512 CPUs and on the GPU.
on_cpu_fp8 = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() == "AVX2",
    reason="oneDNN's FP8 matmul is unreliable on an AVX2 CPU (torch 2.13); FP8 is a GPU feature",
)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _run(fn, x, w, b=None):
    """``fn(x, w, b)`` forward, then backward of Σ y·r for a fixed r: (y, ∂x, ∂W)."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = fn(x, w, b)
    r = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device)
    (y.float() * r).sum().backward()
    return y.detach(), x.grad, w.grad


# ------------------------------------------------------------------ scaling
@pytest.mark.parametrize(("dtype", "step"), [(E4M3, 2**-3), (E5M2, 2**-2)])
def test_quantize_maps_amax_to_the_largest_value_and_round_trips(dtype, step):
    t = torch.randn(64, 48) * 3.0
    t8, inv = quantize(t, dtype)
    assert t8.dtype == dtype
    assert t8.float().abs().max().item() == FP8_MAX[dtype]  # amax → the largest representable value
    assert torch.allclose(inv, t.abs().max() / FP8_MAX[dtype])
    back = dequantize(t8, inv)
    normal = t.abs() > t.abs().max() * 2**-6  # far from the subnormals
    # round to nearest with m mantissa bits: relative error ≤ 2^-(m+1)
    assert ((back - t).abs() / t.abs())[normal].max().item() <= step / 2 + 1e-6
    assert rel(back, t) > 0  # it really was rounded


@on_cpu_fp8
def test_zero_input_gives_zero_output_and_finite_gradients():
    t8, inv = quantize(torch.zeros(16, 16), E4M3)
    assert torch.isfinite(inv) and not t8.float().any()
    b = torch.randn(32)
    y, gx, gw = _run(fp8_linear, torch.zeros(16, 32), torch.randn(32, 32), b)
    assert torch.equal(y, b.expand(16, 32))
    assert torch.isfinite(gx).all() and torch.isfinite(gw).all() and not gw.any()


# ------------------------------------------------------------------ layouts
@on_cpu_fp8
def test_scaled_mm_checks_the_layouts_the_gpu_kernel_needs():
    a8, ai = quantize(torch.randn(32, 64), E4M3)
    b8, bi = quantize(torch.randn(48, 64), E4M3)  # (N, K)
    y = scaled_mm(a8, b8.t(), ai, bi, torch.float32)  # b8.t() is (K, N) column-major
    assert torch.allclose(y, dequantize(a8, ai) @ dequantize(b8, bi).t(), rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError, match="column-major"):
        scaled_mm(a8, b8.t().contiguous(), ai, bi, torch.float32)
    with pytest.raises(AssertionError, match="row-major"):
        scaled_mm(column_major(a8), b8.t(), ai, bi, torch.float32)
    with pytest.raises(AssertionError):  # K = 40 is not a multiple of 16
        scaled_mm(a8[:, :40], b8.t()[:40], ai, bi, torch.float32)
    g8, gi = quantize(torch.randn(32, 64), E5M2)
    with pytest.raises(AssertionError, match="e5m2"):
        scaled_mm(g8, quantize(torch.randn(48, 64), E5M2)[0].t(), gi, gi, torch.float32)
    assert column_major(b8).stride() == (1, 48) and torch.equal(column_major(b8).float(), b8.float())


# ------------------------------------------------------------ forward/backward
@on_cpu_fp8
@pytest.mark.parametrize("wgrad", WGRAD)
@pytest.mark.parametrize("rows", [64, 7 * 3])  # 21 rows: padded to 32 inside
def test_forward_and_backward_match_float32_within_fp8_precision(rows, wgrad):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(rows, 64, generator=g), torch.randn(48, 64, generator=g) * 0.02, torch.randn(48)
    y8, gx8, gw8 = _run(lambda x, w, b: fp8_linear(x, w, b, wgrad), x, w, b)
    y, gx, gw = _run(F.linear, x, w, b)
    assert y8.shape == y.shape and gx8.shape == gx.shape and gw8.shape == gw.shape
    assert 0 < rel(y8 - b, y - b) < 0.06  # e4m3 × e4m3
    assert 0 < rel(gx8, gx) < 0.12  # e5m2 × e4m3
    assert 0 < rel(gw8, gw) < 0.12 if wgrad == "fp8" else torch.allclose(gw8, gw, atol=1e-5, rtol=1e-4)


@on_cpu_fp8
def test_batched_input_and_autocast_dtype():
    x, w = torch.randn(2, 8, 32), torch.randn(16, 32)
    xt = torch.randn(32, 16).t()  # a transposed view: its casts would keep column-major strides
    assert torch.allclose(fp8_linear(xt, w), fp8_linear(xt.contiguous(), w))
    assert fp8_linear(x, w).shape == (2, 8, 16) and fp8_linear(x, w).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fp8_linear(x, w).dtype == torch.bfloat16  # what nn.Linear returns under autocast


@on_cpu_fp8
@pytest.mark.parametrize("wgrad", WGRAD)
def test_compiled_fullgraph_matches_eager(wgrad):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(32, 64, generator=g), torch.randn(48, 64, generator=g) * 0.02, torch.randn(48)

    def fn(x, w, b):
        return fp8_linear(x, w, b, wgrad)

    # fullgraph: dynamo traces the autograd.Function without a break (aot_eager: its backward too)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    eager, comp = _run(fn, x, w, b), _run(compiled, x, w, b)
    for a, c in zip(eager, comp, strict=True):
        assert rel(c, a) < 1e-2


# ------------------------------------------------------------- the layer swap
def test_enable_fp8_swaps_the_named_groups_and_keeps_the_weights():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    before = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    names = enable_fp8(model, ["mlp", "head"], wgrad="fp8", check=False)
    assert sorted(names) == sorted(
        ["lm_head"] + [f"blocks.{i}.mlp.{p}" for i in (0, 1) for p in ("fc", "proj")]
    )
    assert all(type(model.get_submodule(n)) is FP8Linear for n in names)
    assert all(model.get_submodule(n).wgrad == "fp8" for n in names)
    assert type(model.blocks[0].attn.qkv) is torch.nn.Linear  # attn was not asked for
    after = model.state_dict()
    assert set(after) == set(before)  # the same names: a checkpoint is the same file
    assert all(after[k].data_ptr() == before[k][0] and torch.equal(after[k], before[k][1]) for k in after)
    assert model.lm_head.weight is model.wte.weight  # still tied
    assert model.blocks[0].mlp.proj.residual_out
    all_names = enable_fp8(GPT(GPTConfig(**TINY)), ["all"], check=False)
    assert len(all_names) == 2 * 4 + 1


def test_groups_cover_cross_attention_and_experts_but_not_the_router():
    encdec = build_model(GPTConfig(**{**TINY, "n_layer": 1, "arch": "encoder-decoder"}))
    names = enable_fp8(encdec, ["attn"], check=False)
    assert "blocks.0.cross_attn.kv" in names and "enc_blocks.0.attn.qkv" in names
    assert not any("mlp" in n for n in names)
    moe = GPT(GPTConfig(**{**TINY, "n_layer": 1, "n_experts": 2}))
    names = enable_fp8(moe, ["mlp"], check=False)
    assert "blocks.0.mlp.experts.1.fc" in names and "blocks.0.mlp.router" not in names


@on_cpu_fp8
def test_a_frozen_weight_gets_no_gradient_product(monkeypatch):
    keep, product = WGRAD["bf16"]
    calls = []
    monkeypatch.setitem(WGRAD, "bf16", (keep, lambda *a: calls.append(1) or product(*a)))
    x, w = torch.randn(16, 32, requires_grad=True), torch.randn(16, 32)  # w frozen (a LoRA base)
    fp8_linear(x, w).sum().backward()
    assert x.grad is not None and w.grad is None and not calls  # ∂L/∂W never computed
    fp8_linear(x, w.requires_grad_()).sum().backward()
    assert w.grad is not None and calls == [1]


@on_cpu_fp8
def test_fp8_layers_are_plain_without_gradients_and_fp8_with():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    idx = torch.randint(0, 60, (2, 16))
    with torch.no_grad():
        ref = model(idx)
    enable_fp8(model, ["all"], check=False)
    with torch.no_grad():  # evaluation and sampling: the weights as they are, exactly
        assert torch.equal(model(idx), ref)
    logits, _ = model(idx, idx)  # with gradients: FP8 products, close but not equal
    assert 0 < rel(logits.detach(), ref) < 0.1


def test_fp8_choice_errors_are_one_line():
    model = GPT(GPTConfig(**TINY))
    with pytest.raises(GptlabError, match="unknown layer group"):
        enable_fp8(model, ["mlp", "everything"], check=False)
    with pytest.raises(GptlabError, match=r"fp8 needs an NVIDIA GPU of compute capability ≥ 8\.9.*cpu"):
        enable_fp8(model, ["mlp"], "cpu")
    with pytest.raises(GptlabError, match="fp8 needs an NVIDIA GPU"):
        check_device("cpu")
    assert enable_fp8(model, [], "cpu") == []  # nothing asked: nothing checked
    odd = GPT(GPTConfig(**{**TINY, "vocab_multiple": 1}))  # a head of 60 rows
    with pytest.raises(GptlabError, match="vocab_multiple=64"):
        enable_fp8(odd, ["head"], check=False)
    with pytest.raises(GptlabError, match="fp8 must be a list"):
        TrainConfig(fp8=["mlp", "bogus"])
    with pytest.raises(GptlabError, match="fp8_wgrad must be one of"):
        enable_fp8(model, ["mlp"], wgrad="int4", check=False)
    with pytest.raises(GptlabError, match="fp8_wgrad must be one of"):
        TrainConfig(fp8=["mlp"], fp8_wgrad="int4")


def test_an_fp8_head_makes_auto_choose_the_plain_loss():
    big = GPTConfig.preset("gpt2", n_layer=1)
    assert loss_impl(TrainConfig(batch_size=16), big) == "chunked"
    assert loss_impl(TrainConfig(batch_size=16, fp8=["head"]), big) == "plain"
    assert loss_impl(TrainConfig(batch_size=16, fp8=["mlp"]), big) == "chunked"


def _train(fp8: list[str], wgrad: str = "bf16", steps: int = 40) -> list[float]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    enable_fp8(model, fp8, wgrad=wgrad, check=False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 60, (4, 33), generator=g)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@on_cpu_fp8
@pytest.mark.parametrize("wgrad", WGRAD)
def test_a_tiny_model_learns_in_fp8_like_in_bf16(wgrad):
    bf16, fp8 = _train([]), _train(["all"], wgrad)
    assert fp8 != bf16  # the FP8 products really ran
    assert fp8[-1] < 0.7 * fp8[0]
    assert abs(fp8[-1] - bf16[-1]) < 0.1 * bf16[-1]


# ------------------------------------------------------------- the GPU kernel
@pytest.mark.skipif(not HAS_FP8_GPU, reason="needs a CUDA GPU of capability ≥ 8.9 (FP8 tensor cores)")
@pytest.mark.parametrize("wgrad", WGRAD)
def test_gpu_kernel_matches_bf16_and_compiles(wgrad):
    check_device("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(256, 768, device="cuda", generator=g)
    w = torch.randn(3072, 768, device="cuda", generator=g) * 0.02
    compiled = torch.compile(lambda x, w, b: fp8_linear(x, w, b, wgrad), fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y8, gx8, gw8 = _run(compiled, x, w)
        y, gx, gw = _run(F.linear, x, w)
    assert y8.dtype == torch.bfloat16 and 0 < rel(y8, y) < 0.06
    assert 0 < rel(gx8, gx) < 0.12 and rel(gw8, gw) < 0.12


def test_gptlab_train_with_fp8_on_the_cpu_is_one_error_line(capsys, tmp_path):
    from gptlab.cli import main
    from gptlab.data import prepare
    from tests._tiny import TINY_TRAIN

    (tmp_path / "c.txt").write_text("to be or not to be, that is the question.\n" * 40)
    prepare([tmp_path / "c.txt"], tmp_path / "ds", block_size=16)
    argv = ["train", "--data", tmp_path / "ds", "--out", tmp_path / "r", *TINY_TRAIN, "device=cpu"]
    code = main([str(a) for a in [*argv, 'fp8=["mlp", "head"]']])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "error: fp8 needs an NVIDIA GPU of compute capability ≥ 8.9" in err
    assert not (tmp_path / "r").exists()  # a failed start leaves no run behind


@on_cpu_fp8
def test_a_whole_fp8_model_traces_as_one_graph():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    enable_fp8(model, ["all"], check=False)
    idx = torch.randint(0, 60, (2, 16))
    _, eager = model(idx, idx)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # a graph break fails here
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = compiled(idx, idx)
    loss.backward()
    assert abs(loss.item() - eager.item()) < 0.05 * eager.item()
    assert all(
        p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad
    )


@on_cpu_fp8
def test_bench_gpu_smoke_prints_the_fp8_line_beside_bf16(capsys):
    from bench import gpu

    argv = ["--smoke", "--only", "train", "--vocab-multiples", "64", "--loss-impls", "plain"]
    assert gpu.main([*argv, "--fp8-layers", "mlp,head"]) == 0
    nano, bf16, fp8 = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (fp8["impl"], fp8["fp8"], fp8["wgrad"]) == ("gptlab GPT + fp8", ["mlp", "head"], "bf16")
    assert "not a speed" in fp8["note"]  # the CPU kernel is labelled a check
    assert fp8["last_loss"] == pytest.approx(bf16["last_loss"], abs=0.05)  # the same training, in FP8
    assert fp8["vs_baseline"] == pytest.approx(fp8["tokens_per_s"] / nano["tokens_per_s"], rel=1e-2)
