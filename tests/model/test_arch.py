"""The blueprint's other architectures: bidirectional encoders, encoder–decoders, the gated FFN family."""

from __future__ import annotations

import math

import pytest
import torch

from gptlab.errors import GptlabError
from gptlab.generate import BatchSession, generate_ids
from gptlab.model import GPT, EncoderDecoder, GPTConfig, build_model
from gptlab.model.attention import plain_attention
from gptlab.model.mlp import GatedFeedForward, ffn_param_count
from gptlab.model.positional import ALiBiPositions

POS = ["learned", "sinusoidal", "rope", "alibi", "none"]
GATED = ["swiglu", "geglu", "reglu", "dual_glu"]


def tiny(**kw) -> GPTConfig:
    base = dict(vocab_size=37, block_size=16, n_layer=2, n_head=4, n_embd=32, init_std=0.2)
    base.update(kw)
    return GPTConfig(**base)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# ------------------------------------------------------------------ config
def test_arch_sets_causality_and_encoder_depth() -> None:
    assert tiny().causal is True and tiny().n_encoder_layer == 0
    assert tiny(arch="encoder").causal is False
    ed = tiny(arch="encoder-decoder")
    assert ed.causal is True and ed.n_encoder_layer == ed.n_layer
    assert GPTConfig.from_json(ed.to_json()) == ed
    assert tiny(arch="encoder-decoder", n_encoder_layer=3).n_encoder_layer == 3
    with pytest.raises(GptlabError, match="bidirectional"):
        tiny(arch="encoder", causal=True)
    with pytest.raises(GptlabError, match="stays causal"):
        tiny(arch="encoder-decoder", causal=False)
    with pytest.raises(GptlabError, match="arch must be one of"):
        tiny(arch="transducer")
    assert isinstance(build_model(tiny(arch="encoder-decoder")), EncoderDecoder)
    assert type(build_model(tiny(arch="encoder"))) is GPT


# ------------------------------------------------------------------ bidirectional attention
@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("pos", POS)
def test_bidirectional_output_sees_later_tokens(pos: str, placement: str) -> None:
    model = GPT(tiny(pos=pos, arch="encoder", norm_placement=placement)).eval()
    a = torch.randint(0, 37, (1, 12))
    b = a.clone()
    b[0, 10] = (a[0, 10] + 1) % 37  # a later token changes
    la, lb = model(a), model(b)
    for i in (0, 3, 9):  # every earlier position sees it
        assert not torch.allclose(la[0, i], lb[0, i], atol=1e-6)
    causal = GPT(tiny(pos=pos, norm_placement=placement)).eval()
    torch.testing.assert_close(causal(a)[0, :10], causal(b)[0, :10], atol=1e-6, rtol=0)


@pytest.mark.parametrize("pos", POS)
def test_bidirectional_padding_mask_still_applies_and_paths_agree(pos: str) -> None:
    model = GPT(tiny(pos=pos, arch="encoder", n_kv_head=2)).eval()
    ids = torch.randint(0, 37, (1, 8))
    padded = torch.cat([ids, torch.randint(0, 37, (1, 4))], dim=1)
    mask = torch.tensor([[True] * 8 + [False] * 4])[:, None, None, :]  # keys 8..11 are padding
    alone = model(ids)
    for impl in ("sdpa", "plain"):
        out = model.set_attention_impl(impl)(padded, attn_mask=mask)
        torch.testing.assert_close(out[:, :8], alone, atol=1e-5, rtol=0)
    fast = model.set_attention_impl("sdpa")(padded)
    plain = model.set_attention_impl("plain")(padded)
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=0)


def test_bidirectional_weights_fill_every_row_and_alibi_is_symmetric() -> None:
    model = GPT(tiny(pos="alibi", arch="encoder")).eval()
    out = model.run(torch.randint(0, 37, (1, 6)), output_attentions=True)
    assert out.attentions is not None
    assert all(bool((w > 0).all()) for w in out.attentions)  # no −∞ anywhere: both directions
    bias = ALiBiPositions(tiny(pos="alibi")).bias(5, 5, torch.device("cpu"), torch.float32, causal=False)
    torch.testing.assert_close(bias, bias.transpose(-1, -2))
    assert bias[0, 0, 4].item() == pytest.approx(bias[0, 4, 0].item()) and bias[0, 0, 4].item() < 0


# ------------------------------------------------------------------ gated feed-forward family
@pytest.mark.parametrize("mlp", GATED)
def test_gated_networks_follow_their_equation_and_the_two_thirds_rule(mlp: str) -> None:
    config = tiny(n_embd=96, mlp=mlp, glu_act="tanh")
    assert config.d_ff == 64 * math.ceil(8 * 96 / 3 / 64)  # 2/3 of 4·d, rounded up to 64
    ffn = GatedFeedForward(config).eval()
    n = sum(p.numel() for p in ffn.parameters())
    assert n == ffn_param_count(96, config.d_ff, gated=True, bias=True)
    dense = 8 * 96 * 96
    assert abs(3 * 96 * config.d_ff - dense) / dense < 0.05  # close to the 4·d FFN's 8·d²
    x = torch.randn(2, 3, 96)
    g, u = ffn.gate(x), ffn.up(x)
    acts = {
        "swiglu": (torch.nn.functional.silu(g), u),
        "geglu": (torch.nn.functional.gelu(g), u),
        "reglu": (torch.relu(g), u),
        "dual_glu": (torch.tanh(g), torch.tanh(u)),  # σ(W₁x + b₁) ⊙ σ(W₂x + b₂), σ = glu_act
    }
    a, b = acts[mlp]
    torch.testing.assert_close(ffn(x), ffn.proj(a * b))


def test_dual_glu_sigma_is_selectable() -> None:
    x = torch.randn(4, 32)
    sig = GatedFeedForward(tiny(mlp="dual_glu"))
    torch.testing.assert_close(sig(x), sig.proj(torch.sigmoid(sig.gate(x)) * torch.sigmoid(sig.up(x))))
    with pytest.raises(GptlabError, match="glu_act must be one of"):
        tiny(mlp="dual_glu", glu_act="softmax")


@pytest.mark.parametrize("mlp", GATED)
def test_gated_networks_keep_the_kv_cache_exact(mlp: str) -> None:
    model = GPT(tiny(mlp=mlp, pos="rope", n_kv_head=2, block_size=24)).eval()
    seq = torch.randint(0, 37, (14,)).tolist()
    session = BatchSession(model, max_batch=1)
    slot, logits = session.add(seq[:5])
    for t in range(5, 14):
        with torch.no_grad():
            ref = model(torch.tensor([seq[:t]]))[0, -1]
        torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
        logits = session.step({slot: seq[t]})[slot]


# ------------------------------------------------------------------ encoder–decoder
def _ed(**kw) -> EncoderDecoder:
    return EncoderDecoder(tiny(arch="encoder-decoder", **kw)).eval()


@pytest.mark.parametrize(
    "options",
    [
        dict(pos="learned"),
        dict(pos="sinusoidal", norm_placement="post"),
        dict(pos="rope", n_kv_head=2, mlp="swiglu", norm="rmsnorm"),
        dict(pos="alibi", n_kv_head=1, mlp="dual_glu", qk_norm=True),
        dict(pos="none", mlp="geglu", bias=False, tie_embeddings=False),
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_decoder_stays_causal_and_source_padding_changes_nothing(options: dict) -> None:
    model = _ed(**options)
    src = torch.randint(0, 37, (1, 7))
    tgt = torch.randint(0, 37, (1, 10))
    changed = tgt.clone()
    changed[0, 6:] = (tgt[0, 6:] + 1) % 37
    a, b = model(tgt, source=src), model(changed, source=src)
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=1e-6, rtol=0)  # the decoder is causal
    assert not torch.allclose(a[:, 6:], b[:, 6:])
    padded = torch.cat([src, torch.randint(0, 37, (1, 5))], dim=1)
    mask = torch.tensor([[True] * 7 + [False] * 5])
    for impl in ("sdpa", "plain"):
        out = model.set_attention_impl(impl)(tgt, source=padded, source_mask=mask)
        torch.testing.assert_close(out, a, atol=1e-5, rtol=0)


def test_source_reaches_the_decoder_only_through_cross_attention() -> None:
    model = _ed(pos="rope", n_kv_head=2)
    tgt = torch.randint(0, 37, (1, 9))
    s1, s2 = torch.randint(0, 37, (1, 6)), torch.randint(0, 37, (1, 6))
    assert not torch.allclose(model(tgt, source=s1), model(tgt, source=s2))
    handles = [
        b.cross_attn.register_forward_hook(lambda m, args, out: (torch.zeros_like(out[0]), out[1]))
        for b in model.blocks
    ]
    try:  # with the cross-attention sublayers silenced, the source no longer matters
        torch.testing.assert_close(model(tgt, source=s1), model(tgt, source=s2), atol=0, rtol=0)
    finally:
        for h in handles:
            h.remove()


def test_cross_attention_is_the_equation_with_the_source_padding_mask() -> None:
    model = _ed(n_kv_head=4)
    block = model.blocks[0]
    src = torch.randint(0, 37, (2, 6))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    memory, _ = model.encode(src, mask)
    h = torch.randn(2, 5, 32)
    y, w = block.cross_attn(h, block.cross_attn.memory_kv(memory), mask[:, None, None, :], need_weights=True)
    ca = block.cross_attn
    q = ca.q(h).view(2, 5, 4, 8).transpose(1, 2)
    k, v = ca.kv(memory).split(32, dim=-1)
    k, v = k.view(2, 6, 4, 8).transpose(1, 2), v.view(2, 6, 4, 8).transpose(1, 2)
    m = torch.zeros(2, 1, 1, 6).masked_fill(~mask[:, None, None, :], float("-inf"))
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + m, dim=-1)  # (B, H, T, S)
    torch.testing.assert_close(w, a)
    assert torch.all(w[1, :, :, 4:] == 0)  # padded source tokens get exactly zero weight
    torch.testing.assert_close(y, ca.proj((a @ v).transpose(1, 2).reshape(2, 5, 32)))
    ref, _ = plain_attention(q, k, v, mask[:, None, None, :], None, 0.0, False, False)
    torch.testing.assert_close(a @ v, ref)


def test_encoder_decoder_outputs_every_attention_and_counts_cross_attention() -> None:
    model = _ed(n_encoder_layer=3)
    out = model.run(torch.randint(0, 37, (2, 5)), source=torch.randint(0, 37, (2, 7)), output_attentions=True)
    assert [a.shape for a in out.attentions] == [(2, 4, 5, 5)] * 2
    assert [a.shape for a in out.cross_attentions] == [(2, 4, 5, 7)] * 2
    assert [a.shape for a in out.encoder_attentions] == [(2, 4, 7, 7)] * 3
    counts = model.num_params()
    cross = sum(p.numel() for b in model.blocks for p in b.cross_attn.parameters())
    self_attn = sum(p.numel() for b in [*model.blocks, *model.enc_blocks] for p in b.attn.parameters())
    assert counts["attention"] == cross + self_attn
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    with pytest.raises(GptlabError, match="needs a source"):
        model(torch.zeros(1, 3, dtype=torch.long))


def test_bound_decoder_caches_cross_attention_once() -> None:
    model = _ed(pos="alibi", n_kv_head=2)
    src = torch.randint(0, 37, (6,)).tolist()
    bound = model.bind(src)
    calls = []
    hooks = [b.cross_attn.kv.register_forward_hook(lambda *a: calls.append(1)) for b in model.blocks]
    try:
        session = BatchSession(bound, max_batch=3)
        slot, logits = session.add([1])
        seq = [1, 5, 9, 2, 4]
        for t in range(1, len(seq)):
            with torch.no_grad():
                ref = model(torch.tensor([seq[:t]]), source=torch.tensor([src]))[0, -1]
            torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
            logits = session.step({slot: seq[t]})[slot]
    finally:
        for h in hooks:
            h.remove()
    assert len(calls) == (len(seq) - 1) * len(model.blocks)  # only the uncached references recompute


def test_encoder_decoder_learns_to_copy_in_a_few_steps() -> None:
    model = EncoderDecoder(tiny(arch="encoder-decoder", vocab_size=12, n_embd=64, pos="rope", dropout=0.0))
    g = torch.Generator().manual_seed(0)
    src = torch.randint(2, 12, (64, 6), generator=g)
    tgt = torch.cat([torch.zeros(64, 1, dtype=torch.long), src.flip(1)], dim=1)  # BOS=0, reversed
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(tgt[:, :-1], tgt[:, 1:], source=src)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3


def test_hugging_face_export_writes_other_architectures_as_remote_code(tmp_path) -> None:
    import json

    from gptlab.interop.hf import export_family, to_hf

    for arch, name in (("encoder", "GptlabForMaskedLM"), ("encoder-decoder", "GptlabForSeq2SeqLM")):
        with pytest.raises(GptlabError, match=f"arch='{arch}'"):  # no native transformers class
            export_family(tiny(arch=arch))
        to_hf(build_model(tiny(arch=arch)), tmp_path / arch)  # tests/interop/test_export_hf.py loads these
        assert json.loads((tmp_path / arch / "config.json").read_text())["architectures"] == [name]


def test_dropout_composes_with_both_stacks_and_an_encoder_cannot_generate() -> None:
    model = EncoderDecoder(tiny(arch="encoder-decoder", dropout=0.3))
    tgt, src = torch.randint(0, 37, (2, 6)), torch.randint(0, 37, (2, 5))
    model.train()
    assert not torch.allclose(model(tgt, source=src), model(tgt, source=src))  # dropout is active
    model.eval()
    torch.testing.assert_close(model(tgt, source=src), model(tgt, source=src))
    with pytest.raises(GptlabError, match="bidirectional encoder"):
        generate_ids(GPT(tiny(arch="encoder")), torch.zeros(1, 2, dtype=torch.long), 3)
