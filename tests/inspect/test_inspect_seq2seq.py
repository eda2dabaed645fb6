"""trace and attention know encoders and encoder–decoders: encoder stage, cross-attention maps."""

from __future__ import annotations

import json

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.cli import main
from gptlab.inspect import trace
from gptlab.inspect.attention import seq2seq_maps
from gptlab.model import GPT, EncoderDecoder, GPTConfig
from gptlab.tokenizers import CharTokenizer


@pytest.fixture(scope="module")
def s2s_ckpt(tmp_path_factory):
    torch.manual_seed(0)
    tok = CharTokenizer.from_text("abcdefgh", special_tokens=["<|endoftext|>"])
    config = GPTConfig(
        vocab_size=tok.vocab_size,
        block_size=12,
        n_layer=2,
        n_encoder_layer=3,
        n_head=2,
        n_embd=16,
        arch="encoder-decoder",
        pos="rope",
    )
    path = tmp_path_factory.mktemp("s2s") / "ckpt"
    ckpt.save(EncoderDecoder(config), tok, path)
    return path


def test_trace_shows_encoder_and_cross_attention(s2s_ckpt) -> None:
    model, tok = ckpt.load(s2s_ckpt)
    t = trace(model, tok, "abcde", target="ed")
    assert [x["token"] for x in t.encoder["tokens"]] == list("abcde")
    assert len(t.encoder["layers"]) == 3 and len(t.layers) == 2
    assert [x["token"] for x in t.tokens][1:] == ["e", "d"]  # BOS + target feed the decoder
    for layer in t.layers:
        assert len(layer["cross_attention"]) == 2
        assert all(0 <= a["position"] < 5 for h in layer["cross_attention"] for a in h["top"])
    text = t.render()
    assert "1b. Encoder: 3 bidirectional blocks" in text and "cross  0:" in text
    json.dumps(t.to_dict())


def test_seq2seq_maps_have_target_by_source_shapes(s2s_ckpt) -> None:
    model, tok = ckpt.load(s2s_ckpt)
    maps = seq2seq_maps(model, tok, "abcdef", "fed")
    assert maps["cross"].shape == (2, 2, 4, 6)  # layers, heads, BOS + 3 target, 6 source
    assert maps["encoder"].shape == (3, 2, 6, 6) and maps["decoder"].shape == (2, 2, 4, 4)
    torch.testing.assert_close(maps["cross"].sum(-1), torch.ones(2, 2, 4))
    assert (maps["encoder"] > 0).all()  # bidirectional: no masked cells
    assert (maps["decoder"][..., 0, 1:] == 0).all()  # causal
    greedy = seq2seq_maps(model, tok, "abc")  # default target: the model's own output
    assert greedy["target_ids"][0] == tok.eot_id


@pytest.mark.parametrize("stage", ["cross", "encoder", "decoder"])
def test_attention_cli_draws_each_stage(s2s_ckpt, tmp_path, capsys, stage) -> None:
    out = tmp_path / f"{stage}.png"
    args = [
        "attention",
        str(s2s_ckpt),
        "abcd",
        "--target",
        "dc",
        "--stage",
        stage,
        "--layer",
        "0",
        "-o",
        str(out),
    ]
    assert main(args) == 0 and out.stat().st_size > 0
    assert main([*args[:-2], "--head", "1", "-o", str(out)]) == 0
    assert main(["trace", str(s2s_ckpt), "abcd", "--target", "dc"]) == 0
    assert "Encoder" in capsys.readouterr().out


def test_encoder_trace_and_maps_are_bidirectional(tmp_path) -> None:
    torch.manual_seed(0)
    tok = CharTokenizer.from_text("abcdefgh")
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16, arch="encoder")
    )
    ckpt.save(model, tok, tmp_path / "enc")
    assert (
        main(["attention", str(tmp_path / "enc"), "abcd", "--layer", "0", "-o", str(tmp_path / "a.png")]) == 0
    )
    t = trace(model, tok, "abcd")
    first_head = t.layers[0]["attention"][0]["top"]
    assert len(first_head) == 3  # the last token attends over all four, so three can be listed
