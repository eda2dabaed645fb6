"""``convert --to-hf`` writes the tokenizer too, so ``transformers.pipeline`` runs on a gptlab-trained model
with no other input; ``convert --from-hf`` reads ``tokenizer.json`` back (ids, special tokens, template)."""

from __future__ import annotations

import pytest

import gptlab
from gptlab.cli import main
from gptlab.tokenizers import BPETokenizer, CharTokenizer
from tests._tiny import tiny_model

transformers = pytest.importorskip("transformers", reason="transformers is the reference loader")

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 8


def _export(tmp_path, tok, **cfg) -> tuple:
    model = tiny_model(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2, **cfg)
    ckpt = gptlab.save(model, tok, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    return model, tmp_path / "hf"


@pytest.mark.parametrize(
    "make_tok, cfg",
    [
        (lambda: CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"]), {}),
        (
            lambda: BPETokenizer.train(TEXT, vocab_size=300, pattern="gpt4"),
            dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False),
        ),
    ],
    ids=["char-gpt2", "bpe-llama"],
)
def test_pipeline_runs_on_the_exported_directory(tmp_path, make_tok, cfg):
    tok = make_tok()
    model, hf_dir = _export(tmp_path, tok, **cfg)
    pipe = transformers.pipeline("text-generation", model=str(hf_dir), device="cpu")
    prompt = "Before we"
    out = pipe(prompt, max_new_tokens=10, do_sample=False)[0]["generated_text"]
    assert out.startswith(prompt) and len(out) > len(prompt)
    # the same greedy continuation as gptlab's own generation
    from gptlab.generate import SampleConfig, generate_text

    ours = generate_text(model, tok, prompt, SampleConfig(max_new_tokens=10, temperature=0.0))
    assert out == prompt + ours
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    assert hf_tok.encode(TEXT[:120]) == tok.encode(TEXT[:120])


def test_from_hf_keeps_the_tokenizer_and_template(tmp_path):
    tok = BPETokenizer.train(
        TEXT, vocab_size=300, pattern="gpt2", special_tokens=["<|im_start|>", "<|im_end|>"]
    )
    tok.chat_template = "chatml"
    _export(tmp_path, tok, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    _, back = gptlab.load(tmp_path / "back")
    assert back.kind == "pretrained" and back.encode(TEXT) == tok.encode(TEXT)
    assert back.special_tokens == tok.special_tokens and "<|im_start|>" in back.chat_template
