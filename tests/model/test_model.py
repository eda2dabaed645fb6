"""The transformer against the blueprint's equations, causality for every option, and training."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from gptlab import GPT, GPTConfig
from gptlab.model.attention import CausalSelfAttention, plain_attention, sdpa_attention, share_kv_heads
from gptlab.model.gelu import _CompiledGELU, gelu
from gptlab.model.mlp import FeedForward, ffn_param_count, gelu_tanh, relu2
from gptlab.model.norms import LayerNorm
from gptlab.model.positional import alibi_slopes, sinusoidal_table

POS = ["learned", "sinusoidal", "rope", "alibi", "none"]
MLP = ["relu", "gelu", "gelu_tanh", "relu2", "swiglu", "geglu", "reglu", "dual_glu"]
PLACEMENT = ["pre", "post"]
KV_KIND = {"mha": 4, "gqa": 2, "mqa": 1}


def tiny(**kw) -> GPTConfig:
    base = dict(vocab_size=37, block_size=16, n_layer=2, n_head=4, n_embd=32)
    base.update(kw)
    return GPTConfig(**base)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# ------------------------------------------------------------------ attention
def test_attention_rows_sum_to_one_with_exact_zeros_above_the_diagonal() -> None:
    model = GPT(tiny(pos="alibi", n_kv_head=2)).eval()
    idx = torch.randint(0, 37, (3, 12))
    out = model.run(idx, output_attentions=True)
    assert out.attentions is not None and len(out.attentions) == 2
    for w in out.attentions:
        assert w.shape == (3, 4, 12, 12)
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 12), atol=1e-6, rtol=0)
        upper = torch.triu(torch.ones(12, 12, dtype=torch.bool), diagonal=1)
        assert torch.all(w[..., upper] == 0.0)  # exact zeros: softmax of −∞
        assert torch.all(w[..., ~upper] > 0.0)


def test_plain_path_is_the_written_out_equation() -> None:
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    out, w = plain_attention(q, k, v, None, None, 0.0, True)
    m = torch.full((5, 5), float("-inf")).triu(1)
    expected_w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + m, dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)


@pytest.mark.parametrize("pos", POS)
@pytest.mark.parametrize("kv", list(KV_KIND.values()))
def test_plain_and_sdpa_paths_agree(pos: str, kv: int) -> None:
    model = GPT(tiny(pos=pos, n_kv_head=kv, qk_norm=(kv == 2))).eval()
    idx = torch.randint(0, 37, (2, 16))
    fast = model.set_attention_impl("sdpa")(idx)
    plain = model.set_attention_impl("plain")(idx)
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=0)


def test_paths_agree_with_a_cache_and_a_custom_mask() -> None:
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    mask = torch.rand(2, 1, 3, 7) > 0.3
    mask[..., 0] = True
    bias = torch.randn(4, 3, 7)
    for m, b in [(None, None), (mask, None), (None, bias), (mask, bias)]:
        a, _ = plain_attention(q, k, v, m, b, 0.0, False)
        s, _ = sdpa_attention(q, k, v, m, b, 0.0, False)
        torch.testing.assert_close(a, s, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n_q", [1, 5, 7])  # a decode step, a pass over part of a cache, a whole pass
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_kv_heads_read_in_the_kernel_give_what_their_copies_give(n_q: int, dtype: torch.dtype) -> None:
    """On a CPU the SDPA kernel reads each of the 2 key/value heads for its 3 query heads in place
    (``enable_gqa``): bit for bit what attending over a copy per query head gives, with or without a
    mask or a bias, and the same for the written-out path."""
    g = torch.Generator().manual_seed(n_q)
    q = torch.randn(2, 6, n_q, 8, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, 7, 8, generator=g).to(dtype) for _ in range(2))
    mask = torch.rand(2, 1, n_q, 7, generator=g) > 0.3
    mask[..., 0] = True
    bias = torch.randn(6, n_q, 7, generator=g).to(dtype)
    copies = share_kv_heads(k, v, 6)
    for m, b in [(None, None), (mask, None), (None, bias), (mask, bias)]:
        for path in (sdpa_attention, plain_attention):
            shared, _ = path(q, k, v, m, b, 0.0, False, True, True)
            copied, _ = path(q, *copies, m, b, 0.0, False)
            assert torch.equal(shared, copied)


def test_gqa_stores_only_kv_heads_and_shares_them_across_query_groups() -> None:
    config = tiny(n_kv_head=2)
    attn = CausalSelfAttention(config)
    assert attn.qkv.out_features == (4 + 2 * 2) * 8
    mqa = CausalSelfAttention(tiny(n_kv_head=1))
    assert mqa.qkv.out_features == (4 + 2) * 8


# ------------------------------------------------------------------ causality
@pytest.mark.parametrize(
    ("pos", "placement", "mlp", "kv"), list(itertools.product(POS, PLACEMENT, MLP, KV_KIND))
)
def test_future_tokens_never_change_past_logits(pos: str, placement: str, mlp: str, kv: str) -> None:
    model = GPT(tiny(pos=pos, norm_placement=placement, mlp=mlp, n_kv_head=KV_KIND[kv], n_layer=2)).eval()
    a = torch.randint(0, 37, (1, 16))
    t = 7
    b = a.clone()
    b[0, t + 1 :] = torch.randint(0, 37, (16 - t - 1,))
    b[0, -1] = (a[0, -1] + 1) % 37  # certainly different after t
    la, lb = model(a), model(b)
    torch.testing.assert_close(la[:, : t + 1], lb[:, : t + 1], atol=1e-6, rtol=0)
    assert not torch.allclose(la[:, -1], lb[:, -1])  # the change is seen where it may be


# ------------------------------------------------------------------ blueprint equations
def test_sinusoidal_table_is_the_formula() -> None:
    table = sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_gelu_tanh_is_the_tanh_approximation() -> None:
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    expected = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(gelu_tanh(x), expected)
    assert not torch.allclose(F.gelu(x), expected, atol=1e-6)  # it is not exact GELU


def test_compiled_gelu_equals_exact_gelu_and_its_derivative() -> None:
    """The compiled path's GELU (one shared exponential) is F.gelu to 1e-6, value and slope."""
    x = torch.linspace(-12, 12, 20001, dtype=torch.float32, requires_grad=True)
    y = _CompiledGELU.apply(x)
    (slope,) = torch.autograd.grad(y.sum(), x)
    ref = x.detach().clone().requires_grad_()
    (ref_slope,) = torch.autograd.grad(F.gelu(ref).sum(), ref)
    assert (y - F.gelu(x)).abs().max().item() < 2e-6
    assert (slope - ref_slope).abs().max().item() < 1e-6
    xb = torch.randn(64, 128).to(torch.bfloat16)
    assert _CompiledGELU.apply(xb).dtype == torch.bfloat16
    torch.testing.assert_close(_CompiledGELU.apply(xb), F.gelu(xb))  # bf16 tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu2_is_relu_squared_with_autograds_own_gradient_bit_for_bit(dtype) -> None:
    """The one-pass ReLU² gives the value and gradient of ``F.relu(x).square()``, to the bit."""
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)).to(dtype)
    x[0, :8] = 0.0  # the kink: slope 0
    g = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)).to(dtype)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = relu2(a), F.relu(b).square()
    ya.backward(g)
    yb.backward(g)
    assert ya.dtype == dtype and torch.equal(ya, yb)
    assert torch.equal(a.grad, b.grad)
    assert torch.equal(a.grad[0, :8], torch.zeros(8, dtype=dtype))
    xd = torch.randn(12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(relu2, (xd,))
    if dtype == torch.float32:  # traced whole by torch.compile, forward and backward
        torch._dynamo.reset()
        c = x.clone().requires_grad_()
        yc = torch.compile(relu2, backend="aot_eager", fullgraph=True)(c)
        yc.backward(g)
        assert torch.equal(yc, yb) and torch.equal(c.grad, b.grad)


def test_gelu_uses_the_shared_exponential_only_when_compiled() -> None:
    calls = []
    original = _CompiledGELU.forward

    def spy(ctx, x):  # type: ignore[no-untyped-def]
        calls.append(x.shape)
        return original(ctx, x)

    x = torch.randn(8)
    assert torch.equal(gelu(x), F.gelu(x)) and not calls  # eager: the library kernel
    _CompiledGELU.forward = staticmethod(spy)  # type: ignore[method-assign]
    try:
        torch._dynamo.reset()
        out = torch.compile(gelu, backend="eager")(x)
    finally:
        _CompiledGELU.forward = staticmethod(original)  # type: ignore[method-assign]
        torch._dynamo.reset()
    assert calls, "the compiled graph did not trace _CompiledGELU"
    torch.testing.assert_close(out, F.gelu(x), atol=2e-6, rtol=0)


def test_tied_head_shares_storage_with_the_embedding() -> None:
    model = GPT(tiny())
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()
    with torch.no_grad():
        model.wte.weight[3, 5] = 42.0
    assert model.lm_head.weight[3, 5].item() == 42.0
    untied = GPT(tiny(tie_embeddings=False))
    assert untied.lm_head.weight.data_ptr() != untied.wte.weight.data_ptr()
    assert untied.num_params()["head"] == 37 * 32


@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_has_8_d_squared_parameters_plus_biases_at_ratio_4(bias: bool) -> None:
    d = 48
    ffn = FeedForward(GPTConfig(n_embd=d, n_head=4, mlp="gelu", bias=bias))
    n = sum(p.numel() for p in ffn.parameters())
    assert n == 8 * d * d + ((4 * d + d) if bias else 0)
    assert n == ffn_param_count(d, 4 * d, gated=False, bias=bias)


def test_post_norm_block_computes_ln_of_residual_sums() -> None:
    model = GPT(tiny(norm_placement="post", pos="none", n_layer=1)).eval()
    block = model.blocks[0]
    h = torch.randn(2, 6, 32)
    pos = torch.arange(6)
    out, _ = block(h, pos, model.positional)
    attn, _ = block.attn(h, pos, model.positional)
    h1 = F.layer_norm(h + attn, (32,), block.norm1.weight, block.norm1.bias)  # H' = LN(H + MHA(H))
    expected = F.layer_norm(
        h1 + block.mlp(h1), (32,), block.norm2.weight, block.norm2.bias
    )  # LN(H' + FFN(H'))
    torch.testing.assert_close(out, expected)
    assert isinstance(block.norm1, LayerNorm)
    assert isinstance(model.norm_f, torch.nn.Identity)


def test_pre_norm_block_computes_residual_of_normalised_input() -> None:
    model = GPT(tiny(pos="none", n_layer=1)).eval()
    block = model.blocks[0]
    h = torch.randn(2, 6, 32)
    pos = torch.arange(6)
    out, _ = block(h, pos, model.positional)
    h1 = h + block.attn(block.norm1(h), pos, model.positional)[0]
    torch.testing.assert_close(out, h1 + block.mlp(block.norm2(h1)))


def test_rope_scores_depend_only_on_relative_position() -> None:
    model = GPT(tiny(pos="rope"))
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(pq: int, pk: int) -> float:
        rq, _ = model.positional.rotate(q, q, torch.tensor([pq]))
        _, rk = model.positional.rotate(k, k, torch.tensor([pk]))
        return (rq * rk).sum().item()

    assert score(5, 3) == pytest.approx(score(9, 7), abs=1e-5)
    assert score(5, 3) != pytest.approx(score(5, 1), abs=1e-3)


def test_alibi_slopes_for_eight_heads_are_the_paper_sequence() -> None:
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert alibi_slopes(6).shape == (6,)


def test_gpt2_initialisation_scales_residual_projections() -> None:
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=8, n_head=4, n_embd=256))
    std = model.blocks[0].attn.proj.weight.std().item()
    assert std == pytest.approx(0.02 / math.sqrt(16), rel=0.1)
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.1)
    assert torch.all(model.blocks[0].attn.qkv.bias == 0)


def test_loss_is_mean_cross_entropy_and_ignores_minus_one() -> None:
    model = GPT(tiny()).eval()
    idx = torch.randint(0, 37, (2, 10))
    targets = torch.randint(0, 37, (2, 10))
    targets[0, :4] = -1
    logits, loss = model(idx, targets)
    keep = targets != -1
    manual = -torch.log_softmax(logits, -1)[keep].gather(-1, targets[keep][:, None]).mean()
    torch.testing.assert_close(loss, manual)


def test_logit_softcap_bounds_logits() -> None:
    model = GPT(tiny(logit_softcap=2.0))
    with torch.no_grad():
        model.wte.weight.mul_(100)
    assert model(torch.randint(0, 37, (1, 8))).abs().max() <= 2.0


def test_mixture_of_experts_routes_and_reports_a_balancing_loss() -> None:
    model = GPT(tiny(n_experts=4, experts_top_k=2))
    idx = torch.randint(0, 37, (2, 16))
    out = model.run(idx, idx)
    assert out.aux_loss is not None and out.aux_loss.item() >= 2 * 1.0 - 1e-4  # ≥ 1 per layer, 1 at uniform
    ce = F.cross_entropy(out.logits.reshape(-1, 37), idx.reshape(-1))
    torch.testing.assert_close(out.loss, ce + 0.01 * out.aux_loss)
    out.loss.backward()
    assert model.blocks[0].mlp.router.weight.grad is not None


def test_context_overflow_is_a_clear_error() -> None:
    from gptlab import GptlabError

    with pytest.raises(GptlabError, match="exceeds the context length block_size=16"):
        GPT(tiny())(torch.zeros(1, 17, dtype=torch.long))


# ------------------------------------------------------------------ training works
TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings "
    "and arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them."
)


def _overfit(config: GPTConfig, steps: int = 300) -> float:
    torch.manual_seed(0)
    chars = sorted(set(TEXT))
    ids = torch.tensor([chars.index(c) for c in TEXT[:200]])
    block = config.block_size
    windows = torch.stack([ids[i : i + block + 1] for i in range(0, len(ids) - block, 4)])
    x, y = windows[:, :-1], windows[:, 1:]
    model = GPT(config)
    assert windows.size(0) >= 40  # the 200 tokens in overlapping windows: memorising, not one batch
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    loss = torch.tensor(float("inf"))
    for _ in range(steps):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if loss.item() < 0.1:
            break
    return loss.item()


CHAR_VOCAB = len(set(TEXT))


@pytest.mark.parametrize("pos", POS)
def test_tiny_model_overfits_for_each_positional_option(pos: str) -> None:
    # init_std 0.1: token embeddings on the scale of the fixed sinusoidal table (|PE| ≤ 1)
    config = GPTConfig(
        vocab_size=CHAR_VOCAB, block_size=32, n_layer=2, n_head=4, n_embd=64, pos=pos, init_std=0.1
    )
    assert _overfit(config) < 0.1


@pytest.mark.parametrize("mlp", MLP)
def test_tiny_model_overfits_for_each_feed_forward(mlp: str) -> None:
    config = GPTConfig(
        vocab_size=CHAR_VOCAB,
        block_size=32,
        n_layer=2,
        n_head=4,
        n_embd=64,
        pos="rope",
        mlp=mlp,
        init_std=0.1,
    )
    assert _overfit(config) < 0.1
