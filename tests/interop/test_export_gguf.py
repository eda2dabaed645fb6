"""``to_gguf`` without llama.cpp: files gptlab's own GGUF import reads back to the same function, the
tensor storage rules, the vocabularies, the Modelfile, and the refusals (one line, exit 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package writes GGUF files")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFReader  # noqa: E402

from gptlab import GPT, GPTConfig  # noqa: E402
from gptlab.checkpoint import save  # noqa: E402
from gptlab.cli import main  # noqa: E402
from gptlab.errors import GptlabError  # noqa: E402
from gptlab.interop.gguf import from_gguf, tokenizer_from_gguf  # noqa: E402
from gptlab.interop.gguf_arch import choose  # noqa: E402
from gptlab.interop.gguf_export import storage, to_gguf  # noqa: E402
from gptlab.interop.gguf_vocab import vocab_of  # noqa: E402
from gptlab.tokenizers import BPETokenizer, CharTokenizer, PretrainedTokenizer  # noqa: E402
from gptlab.tokenizers.byte_unicode import bytes_to_token  # noqa: E402
from tests._tiny import tiny_model  # noqa: E402

TEXT = "hello world, the quick brown fox jumps over the lazy dog.\nHELLO again! 123 456"


def _model(vocab_size: int, **options) -> GPT:
    return tiny_model(jitter=0.05, **{"vocab_size": vocab_size, "n_embd": 64, **options})


@pytest.mark.parametrize(
    "options",
    [
        dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_head=2),
        dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False),
        dict(pos="learned", norm="layernorm", mlp="gelu_tanh", bias=True),
    ],
    ids=["llama-gqa", "llama-untied", "gpt2"],
)
def test_import_reads_back_the_same_function(tmp_path, options):
    """llama (q/k rows permuted) and gpt2 files: gptlab's GGUF import gives back the same logits."""
    tok = BPETokenizer.train(TEXT * 4, vocab_size=300, pattern="gpt2")
    model = _model(tok.vocab_size, **options)
    path = to_gguf(model, tmp_path / "m.gguf", tok)
    back = from_gguf(path)
    ids = torch.tensor([tok.encode(TEXT)[:32]])
    with torch.no_grad():
        torch.testing.assert_close(back(ids), model(ids), rtol=1e-5, atol=1e-5)
    assert tokenizer_from_gguf(path).encode(TEXT) == tok.encode(TEXT)


def test_architecture_choice():
    base = dict(pos="rope", norm="rmsnorm", bias=False)
    chosen = {
        ("swiglu", False): "llama",
        ("swiglu", True): "qwen3",
        ("relu2", False): "arcee",
        ("relu2", True): "apertus",
    }
    for (mlp, qk_norm), name in chosen.items():
        assert choose(GPTConfig(**base, mlp=mlp, qk_norm=qk_norm)).name == name
    assert choose(GPTConfig(pos="learned", norm="layernorm", mlp="gelu_tanh")).name == "gpt2"


def test_default_recipe_exports_as_apertus():
    from gptlab.train.config import DEFAULT_RECIPE, build_config

    model = dict(build_config(DEFAULT_RECIPE, []).model)
    config = GPTConfig.preset(model.pop("preset"), vocab_size=65, **model)
    assert choose(config).name == "apertus"


def test_xielu_constants_make_relu_squared():
    """softplus in float32 as ggml computes it, ``logf(1 + expf(a))`` with the C library's expf/logf:
    exactly 1 and exactly 0, so llama.cpp's xIELU is max(0, x)²."""
    import ctypes
    import ctypes.util

    from gptlab.interop.gguf_arch import XIELU_ONE, XIELU_ZERO

    name = ctypes.util.find_library("m")
    if name is None:
        pytest.skip("no C math library to call expf/logf from")
    libm = ctypes.CDLL(name)
    for fn in (libm.expf, libm.logf):
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]

    def softplus(a: float) -> float:
        return libm.logf(float(np.float32(1) + np.float32(libm.expf(a))))

    assert softplus(XIELU_ONE) == 1.0
    assert softplus(XIELU_ZERO) == 0.0


def test_storage_rules():
    rng = np.random.default_rng(0)
    matrix, odd = (
        rng.standard_normal((8, 64), dtype=np.float32),
        rng.standard_normal((8, 48), dtype=np.float32),
    )
    assert storage("blk.0.attn_q.weight", matrix, Q.Q8_0)[1] == Q.Q8_0
    assert storage("blk.0.attn_q.weight", odd, Q.Q8_0)[1] == Q.F16  # 48 is not a whole Q8_0 block
    assert storage("blk.0.attn_norm.weight", matrix[0], Q.Q4_0)[1] == Q.F32
    assert storage("blk.0.attn_q_norm.weight", matrix[0], Q.F16)[1] == Q.F32
    assert storage("token_embd.weight", matrix, Q.F32)[1] == Q.F32


def test_q8_0_file_is_small_and_norms_stay_f32(tmp_path):
    tok = CharTokenizer.from_text(TEXT)
    model = _model(
        tok.vocab_size, pos="rope", norm="rmsnorm", mlp="relu2", qk_norm=True, bias=False, n_embd=128
    )
    f32 = to_gguf(model, tmp_path / "f32.gguf", tok)
    q8 = to_gguf(model, tmp_path / "q8.gguf", tok, type="q8_0")
    assert q8.stat().st_size < 0.4 * f32.stat().st_size
    types = {t.name: t.tensor_type for t in GGUFReader(q8).tensors}
    assert types["blk.0.attn_q.weight"] == Q.Q8_0 and types["blk.0.attn_k_norm.weight"] == Q.F32
    assert types["output_norm.weight"] == Q.F32


def test_bpe_merges_cover_every_split():
    """Each token's splits into two tokens are merges, in the joined token's rank order."""
    tok = BPETokenizer.train(TEXT * 4, vocab_size=290, pattern="gpt4")
    vocab = vocab_of(tok, tok.vocab_size)
    assert vocab.pre == "llama-bpe" and vocab.model == "gpt2"
    made = [vocab.tokens.index(a + b) for a, b in (m.split(" ") for m in vocab.merges)]
    assert made == sorted(made)
    assert {
        f"{bytes_to_token(tok.token_bytes(a))} {bytes_to_token(tok.token_bytes(b))}" for a, b in tok.merges
    } <= set(vocab.merges)


def test_vocab_padding_and_special_tokens():
    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    vocab = vocab_of(tok, tok.vocab_size + 3)
    assert vocab.tokens[-1] == f"[PAD{tok.vocab_size + 2}]" and vocab.types[-1] == 5  # UNUSED
    end = tok.special_tokens["<|endoftext|>"]
    assert vocab.eos_id == end and vocab.types[end] == 3 and vocab.model == "rwkv"
    assert vocab.tokens[tok.encode("\n")[0]] == "\\n"  # RWKV vocabularies are escaped text
    with pytest.raises(GptlabError, match="rows"):
        vocab_of(tok, tok.vocab_size - 1)


def test_modelfile(tmp_path):
    chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    tokens = [bytes_to_token(bytes([b])) for b in range(256)] + ["ab", "<|im_start|>", "<|im_end|>"]
    tok = PretrainedTokenizer(tokens, ["a b"], special_ids=[257, 258], eos_id=258, chat_template=chatml)
    to_gguf(
        _model(len(tokens), pos="rope", norm="rmsnorm", mlp="swiglu", bias=False), tmp_path / "c.gguf", tok
    )
    text = (tmp_path / "Modelfile").read_text()
    assert text.startswith("FROM ./c.gguf\n") and "{{ .Content }}<|im_end|>" in text
    assert 'PARAMETER stop "<|im_end|>"' in text and "PARAMETER num_ctx 32" in text
    plain = CharTokenizer.from_text(TEXT)
    to_gguf(
        _model(plain.vocab_size, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False),
        tmp_path / "p.gguf",
        plain,
    )
    assert 'TEMPLATE """{{ .Prompt }}"""' in (tmp_path / "Modelfile").read_text()


def _refused(capsys, args: list[str], needle: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (dict(pos="alibi", norm="rmsnorm", mlp="swiglu", bias=False), "pos='rope'"),
        (dict(pos="learned", norm="layernorm", mlp="gelu", bias=True), "mlp='gelu_tanh'"),
        (
            dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, logit_softcap=30.0),
            "logit_softcap=None",
        ),
        (dict(pos="rope", norm="rmsnorm", mlp="geglu", bias=False), "mlp="),
        (dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=True), "bias=False"),
        (dict(pos="rope", norm="layernorm", mlp="swiglu", bias=False), "norm='rmsnorm'"),
    ],
)
def test_cli_refuses_what_llama_cpp_cannot_compute(tmp_path, capsys, options, needle):
    tok = CharTokenizer.from_text(TEXT)
    save(_model(tok.vocab_size, **options), tok, tmp_path / "ckpt")
    _refused(
        capsys, ["convert", "--to-gguf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "m.gguf")], needle
    )
    assert not (tmp_path / "m.gguf").exists()


def test_cli_refusals_of_input(tmp_path, capsys):
    tok = CharTokenizer.from_text(TEXT)
    save(_model(tok.vocab_size, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False), tok, tmp_path / "ckpt")
    save(
        _model(tok.vocab_size, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False), None, tmp_path / "bare"
    )
    ckpt = str(tmp_path / "ckpt")
    _refused(
        capsys, ["convert", "--to-gguf", str(tmp_path / "nope"), "--out", str(tmp_path / "a.gguf")], "no such"
    )
    _refused(capsys, ["convert", "--to-gguf", ckpt, "--out", str(tmp_path)], "is a directory")
    _refused(
        capsys,
        ["convert", "--to-gguf", str(tmp_path / "bare"), "--out", str(tmp_path / "b.gguf")],
        "tokenizer",
    )
    custom = BPETokenizer.train(TEXT * 4, vocab_size=280, pattern=r"\w+|\s+|[^\w\s]+")
    save(
        _model(custom.vocab_size, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False),
        custom,
        tmp_path / "cus",
    )
    _refused(
        capsys, ["convert", "--to-gguf", str(tmp_path / "cus"), "--out", str(tmp_path / "c.gguf")], "pattern"
    )
    assert main(["convert", "--to-gguf", ckpt, "--out", str(tmp_path / "ok.gguf"), "--type", "q4_0"]) == 0
    assert "ok.gguf" in capsys.readouterr().out
