"""``gptlab size``'s parameter formulas cover the gated FFN family, encoders and encoder–decoders."""

from __future__ import annotations

import itertools

import pytest
import torch

from gptlab.inspect import size_report
from gptlab.inspect.flops import forward_flops_per_token, training_flops_per_token
from gptlab.model import GPTConfig, build_model

GRID = list(
    itertools.product(
        ("swiglu", "geglu", "reglu", "dual_glu", "gelu"),
        ("decoder", "encoder", "encoder-decoder"),
        ("learned", "rope"),
    )
)


@pytest.mark.parametrize(("mlp", "arch", "pos"), GRID)
def test_size_formulas_match_the_model(mlp: str, arch: str, pos: str) -> None:
    i = GRID.index((mlp, arch, pos))
    c = GPTConfig(
        vocab_size=37,
        block_size=16,
        n_layer=2,
        n_head=4,
        n_embd=32,
        mlp=mlp,
        arch=arch,
        pos=pos,
        n_kv_head=(4, 2, 1)[i % 3],
        bias=i % 2 == 0,
        tie_embeddings=i % 4 < 2,
        qk_norm=i % 5 == 0,
        norm_placement=("pre", "post")[i % 2],
        n_encoder_layer=3 if arch == "encoder-decoder" and i % 2 else None,
    )
    report = size_report(c)
    counts = build_model(c).num_params()
    for part in ("embeddings", "positions", "attention", "feed_forward", "norms", "head", "total"):
        assert report.value(part) == counts[part], part
    assert report.value("total") == sum(p.numel() for p in build_model(c).parameters())


# ------------------------------------------------------------- FLOPs and caches by architecture
def _config(arch: str, mlp: str = "swiglu", **changes) -> GPTConfig:
    base = dict(vocab_size=29, block_size=24, n_layer=2, n_head=4, n_embd=32, mlp=mlp, arch=arch, pos="rope")
    return GPTConfig(**{**base, **changes})


def _counted_forward_flops(config: GPTConfig, T: int, S: int) -> int:
    """Matrix-product FLOPs torch actually runs for one sequence (plain attention: the T×T scores in full)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = build_model(config).set_attention_impl("plain").eval()
    idx = torch.randint(0, config.vocab_size, (1, T))
    kwargs = (
        {"source": torch.randint(0, config.vocab_size, (1, S))} if config.arch == "encoder-decoder" else {}
    )
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.run(idx, **kwargs)
    return counter.get_total_flops()


@pytest.mark.parametrize("mlp", ["swiglu", "geglu", "reglu", "dual_glu", "gelu"])
@pytest.mark.parametrize(
    ("arch", "T", "S"), [("decoder", 24, 24), ("encoder", 24, 24), ("encoder-decoder", 9, 21)]
)
def test_flops_formula_is_what_torch_multiplies(arch: str, T: int, S: int, mlp: str) -> None:
    """The formula, times the tokens, equals the matrix products torch runs, up to the vectors (norms'
    γ/β and biases: the formula counts 2 FLOPs per weight, they cost ≤ 1 and no matmul) and the causal
    half that the plain path computes and masks (the formula counts T/2 keys on average)."""
    c = _config(
        arch, mlp, n_kv_head=2, bias=mlp == "gelu", n_encoder_layer=3 if arch == "encoder-decoder" else None
    )
    report = size_report(c, context=T, source=S)
    fwd = forward_flops_per_token(c, T, S)
    assert report.value("forward") == fwd and report.value("training") == 3 * fwd
    vectors = {n: p.numel() for n, p in build_model(c).named_parameters() if p.dim() == 1}
    on_source = sum(n for k, n in vectors.items() if k.startswith("enc_") or ".cross_attn.k" in k)
    on_target = sum(vectors.values()) - on_source
    causal_half = 2 * c.n_layer * T * T * c.n_embd if c.causal else 0
    expected = fwd * T + causal_half - 2 * T * on_target - 2 * S * on_source
    assert _counted_forward_flops(c, T, S) == pytest.approx(expected, abs=T)  # fwd is rounded per token


def test_bidirectional_and_cross_attention_cost_more_than_causal() -> None:
    dec, enc, s2s = (_config(a) for a in ("decoder", "encoder", "encoder-decoder"))
    T, d, L = 24, 32, 2
    assert forward_flops_per_token(enc, T) - forward_flops_per_token(dec, T) == 2 * L * T * d
    short, long = forward_flops_per_token(s2s, T, 8), forward_flops_per_token(s2s, T, 16)
    assert long > short  # cross-attention and the encoder's share grow with the source
    assert training_flops_per_token(s2s) == 3 * forward_flops_per_token(s2s, s2s.block_size, s2s.block_size)


def test_encoder_has_no_kv_cache() -> None:
    report = size_report(_config("encoder"), batch=4)
    assert report.value("per token") == 0 and report.value("cache") == 0


@pytest.mark.parametrize("kv_dtype", ["fp32", "int8"])
def test_encoder_decoder_cache_is_self_cache_plus_cross_kv_once_per_source(kv_dtype: str) -> None:
    from gptlab.inspect.figures import KV_DTYPES
    from gptlab.model import KVCache

    c = _config("encoder-decoder", n_kv_head=2, n_encoder_layer=3)
    B, T, S = 3, 10, 7
    report = size_report(c, context=T, batch=B, source=S, kv_dtype=kv_dtype)
    model = build_model(c).eval()
    cross = [t for kv in model.bind(list(range(S))).cross for t in kv]  # one source: batch 1
    assert report.value("cross K/V (per source)") == B * sum(t.nbytes for t in cross)
    self_cache = KVCache(c, B, T, dtype=KV_DTYPES[kv_dtype][0]).nbytes()
    assert report.value("self-attention cache") == self_cache == report.value("per token") * B * T
    assert report.value("cache") == self_cache + B * sum(t.nbytes for t in cross)


def test_size_cli_on_a_seq2seq_checkpoint(tmp_path, capsys) -> None:
    from gptlab import checkpoint as ckpt
    from gptlab.cli import main
    from gptlab.tokenizers import CharTokenizer

    tok = CharTokenizer.from_text("abcdefgh", special_tokens=["<|endoftext|>"])
    c = _config("encoder-decoder", vocab_size=tok.vocab_size, n_encoder_layer=3)
    ckpt.save(build_model(c), tok, tmp_path / "run")
    assert main(["size", str(tmp_path / "run"), "--source", "11", "--context", "6"]) == 0
    out = capsys.readouterr().out
    for text in ("N_enc (per source token)", "cross K/V (per source)", "4·L·S·d", "L_enc=3", "S=11", "T=6"):
        assert text in out, text
    assert f"{forward_flops_per_token(c, 6, 11) / 1e3:.2f} kFLOPs" in out
