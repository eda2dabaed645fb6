"""``to_hf`` of encoders (``AutoModelForMaskedLM``, ``fill-mask``) and encoder–decoders
(``AutoModelForSeq2SeqLM``, ``generate``): gptlab's logits and tokens, in float32."""

from __future__ import annotations

import pytest
import torch

import gptlab
from gptlab import GPTConfig
from gptlab.cli import main
from gptlab.interop.hf import to_hf
from gptlab.tokenizers import CharTokenizer
from tests.interop._export_hf import SHAPE, TEXT, TOL, hf_dir, load_hf, max_diff, perturbed

transformers = pytest.importorskip("transformers", reason="transformers is the reference loader")

ENCODERS = {
    "bert-like": dict(pos="learned", norm_placement="post", mlp="gelu"),
    "rope-rmsnorm-swiglu-gqa": dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_head=2),
    "alibi-qk_norm": dict(pos="alibi", qk_norm=True),
}


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_loads_as_masked_lm(name, tmp_path):
    model = perturbed(GPTConfig(**SHAPE, arch="encoder", **ENCODERS[name]))
    to_hf(model, hf_dir(tmp_path))
    hf = load_hf(transformers, hf_dir(tmp_path), "AutoModelForMaskedLM")
    assert type(hf).__name__ == "GptlabForMaskedLM"
    idx = torch.randint(0, 61, (2, 13))
    mask = torch.ones_like(idx)
    mask[1, 9:] = 0  # right padding
    with torch.no_grad():
        assert max_diff(hf(idx).logits, model(idx)) <= TOL
        padded = hf(idx, attention_mask=mask).logits
        assert max_diff(padded[1, :9], model(idx[1:, :9])[0]) <= TOL


def test_fill_mask_pipeline_predicts_gptlabs_token(tmp_path):
    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>", "[MASK]"])
    model = perturbed(GPTConfig(**(SHAPE | {"vocab_size": tok.vocab_size}), arch="encoder"))
    ckpt = gptlab.save(model, tok, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(ckpt), "--out", str(hf_dir(tmp_path))]) == 0
    pipe = transformers.pipeline("fill-mask", model=str(hf_dir(tmp_path)), trust_remote_code=True)
    text = "Speak, [MASK]peak."
    best = pipe(text, top_k=1)[0]
    ids = tok.encode(text, allowed_special="all")
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, ids.index(tok.special_tokens["[MASK]"])]
    assert best["token"] == int(logits.argmax())


@pytest.mark.parametrize(
    "options",
    [
        dict(pos="sinusoidal", norm_placement="post"),
        dict(pos="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True),
    ],
    ids=["transformer-2017", "rope-rmsnorm-qk_norm"],
)
def test_encoder_decoder_loads_as_seq2seq_and_generates_gptlabs_tokens(options, tmp_path):
    from gptlab.generate import SampleConfig
    from gptlab.generate.driver import target_ids

    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    model = perturbed(
        GPTConfig(**(SHAPE | {"vocab_size": tok.vocab_size}), arch="encoder-decoder", **options)
    )
    to_hf(model, hf_dir(tmp_path), tok)
    hf = load_hf(transformers, hf_dir(tmp_path), "AutoModelForSeq2SeqLM")
    assert type(hf).__name__ == "GptlabForSeq2SeqLM"
    src, tgt = torch.randint(0, tok.vocab_size, (2, 10)), torch.randint(0, tok.vocab_size, (2, 6))
    mask = torch.ones_like(src)
    mask[1, 7:] = 0
    with torch.no_grad():
        logits = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        assert max_diff(logits[0], model.run(tgt[:1], source=src[:1]).logits[0]) <= TOL
        assert max_diff(logits[1], model.run(tgt[1:], source=src[1:, :7]).logits[0]) <= TOL
        out = hf.generate(src[:1], max_new_tokens=6, do_sample=False)
        seen: list[int] = []
        hook = hf.gpt.wte.register_forward_hook(lambda mod, args, o: seen.append(args[0].size(1)))
        cached = hf.generate(src, attention_mask=mask, max_new_tokens=5, do_sample=False)
        hook.remove()
        uncached = hf.generate(src, attention_mask=mask, max_new_tokens=5, do_sample=False, use_cache=False)
        beams = [
            hf.generate(src, attention_mask=mask, max_new_tokens=5, num_beams=3, do_sample=False, use_cache=c)
            for c in (True, False)
        ]
    assert seen == [10, 1, 1, 1, 1, 1]  # the source once, then one target token per step (gptlab's cache)
    assert torch.equal(cached, uncached) and torch.equal(beams[0], beams[1])
    ours, _ = target_ids(model, src[0].tolist(), tok.eot_id, SampleConfig(max_new_tokens=6, temperature=0.0))
    assert out[0, 0].item() == tok.eot_id  # the decoder starts from <|endoftext|>, as gptlab's does
    assert out[0, 1:].tolist()[: len(ours)] == ours
