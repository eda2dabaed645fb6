"""``to_hf`` for every architecture: transformers loads each export and computes gptlab's logits.

Models without a transformers class are written with their own code (``trust_remote_code=True``),
generated from ``gptlab.model``; Qwen3-shaped models (QK-norm, no biases) use ``Qwen3ForCausalLM``.
Every comparison runs in float32 on tiny models whose weights are perturbed away from their
initialisation (so norms, biases and gates all matter); the bound is 1e-5 on the logits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gptlab
from gptlab import GPT, GPTConfig, GptlabError
from gptlab.cli import main
from gptlab.interop.hf import export_family, to_hf
from gptlab.model import build_model
from gptlab.tokenizers import BPETokenizer, CharTokenizer
from gptlab.tokenizers.hf_files import write_hf_tokenizer

transformers = pytest.importorskip("transformers", reason="transformers is the reference loader")

TOL = 1e-5
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 4
SHAPE = dict(vocab_size=61, block_size=32, n_layer=2, n_head=4, n_embd=32)


def _perturbed(config: GPTConfig, seed: int = 0) -> GPT:
    """``config``'s model in float32 eval mode, every parameter moved off its initial value."""
    torch.manual_seed(seed)
    model = build_model(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def _load(directory: Path, auto: str = "AutoModelForCausalLM", **kw):
    cls = getattr(transformers, auto)
    return cls.from_pretrained(str(directory), trust_remote_code=True, dtype=torch.float32, **kw).eval()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a.float() - b.float()).abs().max().item()


# ------------------------------------------------------------------ decoders through remote code
DECODERS = {
    "char-best": dict(pos="rope", norm="rmsnorm", mlp="relu2", bias=False, qk_norm=True),
    "learned-post-layernorm-gelu-untied": dict(
        pos="learned", norm_placement="post", mlp="gelu", tie_embeddings=False
    ),
    "sinusoidal-rmsnorm-geglu": dict(pos="sinusoidal", norm="rmsnorm", mlp="geglu", bias=False),
    "alibi-reglu-gqa": dict(pos="alibi", mlp="reglu", n_kv_head=2),
    "none-dual_glu-tanh-mqa": dict(pos="none", mlp="dual_glu", glu_act="tanh", n_kv_head=1),
    "rope-relu-softcap-bias": dict(pos="rope", mlp="relu", logit_softcap=5.0),
    "learned-gelu_tanh-no-bias": dict(pos="learned", mlp="gelu_tanh", bias=False),
    "rope-swiglu-qk_norm-bias-gqa": dict(pos="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True, n_kv_head=2),
    "moe-top1": dict(pos="rope", mlp="swiglu", n_experts=2, experts_top_k=1),
    "padded-vocab": dict(pos="rope", mlp="relu2", vocab_multiple=64),  # the file holds the 61 real rows
}


@pytest.mark.parametrize("name", DECODERS)
def test_remote_code_decoder_matches_gptlab(name, tmp_path):
    model = _perturbed(GPTConfig(**SHAPE, **DECODERS[name]))
    with pytest.raises(GptlabError):  # no transformers class computes these: remote code it is
        export_family(model.config)
    to_hf(model, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "gptlab" and config["architectures"] == ["GptlabForCausalLM"]
    hf = _load(tmp_path / "hf")
    idx = torch.randint(0, 61, (3, 17))
    with torch.no_grad():
        assert _max_diff(hf(idx).logits, model(idx)) <= TOL


@pytest.mark.parametrize("name", ["char-best", "learned-post-layernorm-gelu-untied", "alibi-reglu-gqa"])
def test_remote_code_left_padding_matches_each_prompt_alone(name, tmp_path):
    model = _perturbed(GPTConfig(**SHAPE, **DECODERS[name]))
    to_hf(model, tmp_path / "hf")
    hf = _load(tmp_path / "hf")
    idx = torch.randint(0, 61, (2, 12))
    mask = torch.ones_like(idx)
    mask[1, :5] = 0  # row 1: 5 padding tokens, then a 7-token prompt
    with torch.no_grad():
        logits = hf(idx, attention_mask=mask).logits
        assert _max_diff(logits[0], model(idx[:1])[0]) <= TOL
        assert _max_diff(logits[1, 5:], model(idx[1:, 5:])[0]) <= TOL
        out = hf.generate(idx, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert out[1, 12:].tolist() == model.generate(idx[1:, 5:], 4, temperature=0)[0, 7:].tolist()


def test_remote_code_generates_with_gptlabs_kv_cache(tmp_path):
    model = _perturbed(GPTConfig(**SHAPE, **DECODERS["alibi-reglu-gqa"]))
    to_hf(model, tmp_path / "hf")
    hf = _load(tmp_path / "hf")
    idx = torch.randint(0, 61, (2, 8))
    mask = torch.ones_like(idx)
    mask[0, :3] = 0
    seen: list[int] = []
    hook = hf.gpt.wte.register_forward_hook(lambda mod, args, out: seen.append(args[0].size(1)))
    with torch.no_grad():
        cached = hf.generate(idx, attention_mask=mask, max_new_tokens=6, do_sample=False)
        hook.remove()
        uncached = hf.generate(idx, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=False)
        beams = [
            hf.generate(idx, attention_mask=mask, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=c)
            for c in (True, False)
        ]
    assert seen == [8, 1, 1, 1, 1, 1]  # the prompt once, then one new token per step
    assert torch.equal(cached, uncached) and torch.equal(beams[0], beams[1])
    assert cached[0, 8:].tolist() == model.generate(idx[:1, 3:], 6, temperature=0)[0, 5:].tolist()


def test_remote_code_is_forced_on_a_native_model_and_agrees(tmp_path):
    model = _perturbed(GPTConfig.preset("llama-tiny", **SHAPE, n_kv_head=2))
    to_hf(model, tmp_path / "native")
    to_hf(model, tmp_path / "remote", remote_code=True)
    native, remote = _load(tmp_path / "native"), _load(tmp_path / "remote")
    assert type(native).__name__ == "LlamaForCausalLM" and type(remote).__name__ == "GptlabForCausalLM"
    idx = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        assert _max_diff(remote(idx).logits, model(idx)) <= TOL
        assert _max_diff(native(idx).logits, model(idx)) <= TOL


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: ~25 s on 2 busy cores
def test_the_generated_code_loads_without_gptlab(tmp_path):
    model = _perturbed(GPTConfig(**SHAPE, **DECODERS["char-best"]))
    to_hf(model, tmp_path / "hf")
    idx = [[3, 1, 4, 1, 5, 9, 2, 6]]
    script = f"""
import importlib.abc, sys
class NoGptlab(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "gptlab":
            raise ImportError("gptlab is not installed here")
sys.meta_path.insert(0, NoGptlab())
import torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / "hf")!r}, trust_remote_code=True,
                                                      dtype=torch.float32).eval()
assert "gptlab" not in sys.modules
with torch.no_grad():
    print(m(torch.tensor({idx})).logits[0, -1].tolist())
"""
    env = os.environ | {"HF_MODULES_CACHE": str(tmp_path / "modules")}  # a fresh copy of the code
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = torch.tensor(json.loads(run.stdout.strip().splitlines()[-1]))
    with torch.no_grad():
        assert _max_diff(theirs, model(torch.tensor(idx))[0, -1]) <= TOL


def test_the_generated_code_is_gptlab_source(tmp_path):
    """Each generated file is its gptlab module line for line, except the lines that name gptlab."""
    from gptlab.interop.remote_source import flat_name, model_modules

    to_hf(_perturbed(GPTConfig(**SHAPE)), tmp_path / "hf", remote_code=True)
    modules = model_modules()
    assert {"gptlab.model.attention", "gptlab.model.positional", "gptlab.model.encdec"} <= set(modules)
    for module, path in modules.items():
        ours = path.read_text(encoding="utf-8").splitlines()
        generated = (tmp_path / "hf" / f"{flat_name(module)}.py").read_text(encoding="utf-8").splitlines()[1:]
        assert len(generated) == len(ours), module
        changed = [(a, b) for a, b in zip(ours, generated) if a != b]
        assert all("gptlab." in a or "from gptlab import" in a for a, _ in changed), (module, changed[:3])
        assert not any(re.search(r"\b(from|import) gptlab(\.|\s|$)", b) for b in generated), module


# ------------------------------------------------------------------ native classes
QWEN3 = dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, qk_norm=True, norm_eps=1e-6)


@pytest.mark.parametrize(
    "extra", [dict(n_kv_head=2, tie_embeddings=False), dict(n_kv_head=1)], ids=["gqa", "mqa-tied"]
)
def test_qk_norm_swiglu_exports_as_qwen3(extra, tmp_path):
    model = _perturbed(GPTConfig(**SHAPE, **QWEN3, **extra))
    assert export_family(model.config).architecture == "Qwen3ForCausalLM"
    to_hf(model, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    idx = torch.randint(0, 61, (2, 15))
    with torch.no_grad():
        assert _max_diff(hf(idx).logits, model(idx)) <= TOL


@pytest.mark.parametrize("attention_bias", [False, True])
def test_qwen3_imports_from_transformers(attention_bias, tmp_path):
    torch.manual_seed(1)
    cfg = transformers.Qwen3Config(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32, attention_bias=attention_bias,
        tie_word_embeddings=False,
    )  # fmt: skip
    hf = transformers.Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(tmp_path / "hf")
    ours = gptlab.from_hf(tmp_path / "hf")
    assert ours.config.qk_norm and ours.config.bias == attention_bias
    idx = torch.randint(0, 61, (2, 11))
    with torch.no_grad():
        assert _max_diff(ours(idx), hf(idx).logits) <= TOL


def test_the_default_recipe_loads_in_transformers(tmp_path):
    from gptlab.train.config import TrainConfig, read_config_file

    data = read_config_file("char-best")
    config = TrainConfig.from_dict({k: v for k, v in data.items() if k != "model"} | {"model": data["model"]})
    model = _perturbed(config.model_config(65))
    to_hf(model, tmp_path / "hf")
    hf = _load(tmp_path / "hf")
    idx = torch.randint(0, 65, (2, 64))
    with torch.no_grad():
        assert _max_diff(hf(idx).logits, model(idx)) <= TOL


# ------------------------------------------------------------------ encoders and encoder–decoders
ENCODERS = {
    "bert-like": dict(pos="learned", norm_placement="post", mlp="gelu"),
    "rope-rmsnorm-swiglu-gqa": dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_head=2),
    "alibi-qk_norm": dict(pos="alibi", qk_norm=True),
}


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_loads_as_masked_lm(name, tmp_path):
    model = _perturbed(GPTConfig(**SHAPE, arch="encoder", **ENCODERS[name]))
    to_hf(model, tmp_path / "hf")
    hf = _load(tmp_path / "hf", "AutoModelForMaskedLM")
    assert type(hf).__name__ == "GptlabForMaskedLM"
    idx = torch.randint(0, 61, (2, 13))
    mask = torch.ones_like(idx)
    mask[1, 9:] = 0  # right padding
    with torch.no_grad():
        assert _max_diff(hf(idx).logits, model(idx)) <= TOL
        padded = hf(idx, attention_mask=mask).logits
        assert _max_diff(padded[1, :9], model(idx[1:, :9])[0]) <= TOL


def test_fill_mask_pipeline_predicts_gptlabs_token(tmp_path):
    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>", "[MASK]"])
    model = _perturbed(GPTConfig(**(SHAPE | {"vocab_size": tok.vocab_size}), arch="encoder"))
    ckpt = gptlab.save(model, tok, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    pipe = transformers.pipeline("fill-mask", model=str(tmp_path / "hf"), trust_remote_code=True)
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
    from gptlab.generate.seq2seq import generate_ids

    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    model = _perturbed(
        GPTConfig(**(SHAPE | {"vocab_size": tok.vocab_size}), arch="encoder-decoder", **options)
    )
    to_hf(model, tmp_path / "hf", tok)
    hf = _load(tmp_path / "hf", "AutoModelForSeq2SeqLM")
    assert type(hf).__name__ == "GptlabForSeq2SeqLM"
    src, tgt = torch.randint(0, tok.vocab_size, (2, 10)), torch.randint(0, tok.vocab_size, (2, 6))
    mask = torch.ones_like(src)
    mask[1, 7:] = 0
    with torch.no_grad():
        logits = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        assert _max_diff(logits[0], model.run(tgt[:1], source=src[:1]).logits[0]) <= TOL
        assert _max_diff(logits[1], model.run(tgt[1:], source=src[1:, :7]).logits[0]) <= TOL
        out = hf.generate(src[:1], max_new_tokens=6, do_sample=False)
    ours, _ = generate_ids(
        model, src[0].tolist(), tok.eot_id, SampleConfig(max_new_tokens=6, temperature=0.0)
    )
    assert out[0, 0].item() == tok.eot_id  # the decoder starts from <|endoftext|>, as gptlab's does
    assert out[0, 1:].tolist()[: len(ours)] == ours


# ------------------------------------------------------------------ tokenizers and pipelines
def test_text_generation_pipeline_runs_the_remote_code(tmp_path):
    from gptlab.generate import SampleConfig, generate_text

    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    model = _perturbed(GPTConfig(**(SHAPE | {"vocab_size": tok.vocab_size}), **DECODERS["char-best"]))
    ckpt = gptlab.save(model, tok, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), trust_remote_code=True)
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


def test_smollm2_tokenizer_keeps_its_special_ids(tmp_path):
    from gptlab.interop.gguf import read_gguf, tokenizer_from_gguf

    tok = tokenizer_from_gguf(read_gguf("smollm2"))
    write_hf_tokenizer(tok, tmp_path, model_max_length=2048)
    _check_smollm2_ids(transformers.AutoTokenizer.from_pretrained(str(tmp_path)), tok)


@pytest.mark.slow
def test_smollm2_converts_to_hf_with_its_tokenizer_and_logits(tmp_path):
    assert main(["convert", "--from-gguf", "smollm2", "--out", str(tmp_path / "ckpt")]) == 0
    assert main(["convert", "--to-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0
    model, tok = gptlab.load(tmp_path / "ckpt")
    _check_smollm2_ids(transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf")), tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    idx = torch.tensor([tok.encode("<|im_start|>user\nHello!<|im_end|>\n", allowed_special="all")])
    with torch.no_grad():
        # logits up to ~33 in size, through 30 layers of float32 sums taken in different orders
        assert _max_diff(hf(idx).logits, model.float().eval()(idx)) <= 1e-4


def test_cli_names_what_it_wrote(tmp_path, capsys):
    for name, options in (("remote", DECODERS["alibi-reglu-gqa"]), ("qwen3", QWEN3)):
        gptlab.save(_perturbed(GPTConfig(**SHAPE, **options)), None, tmp_path / name)
        assert main(["convert", "--to-hf", str(tmp_path / name), "--out", str(tmp_path / f"{name}-hf")]) == 0
    out = capsys.readouterr().out
    assert "GptlabForCausalLM remote code (AutoModelForCausalLM, trust_remote_code=True)" in out
    assert "Qwen3ForCausalLM (AutoModelForCausalLM)" in out


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_from_hf_reads_a_remote_code_folder_back(arch, tmp_path):
    model = _perturbed(GPTConfig(**SHAPE, arch=arch, **DECODERS["char-best"]))
    to_hf(model, tmp_path / "hf")
    back = gptlab.from_hf(tmp_path / "hf")
    assert back.config.to_dict() == model.config.to_dict()
    idx = torch.randint(0, 61, (2, 9))
    kw = {"source": idx} if arch == "encoder-decoder" else {}
    with torch.no_grad():
        assert torch.equal(back.run(idx, **kw).logits, model.run(idx, **kw).logits)


def test_a_broken_remote_code_folder_is_one_error_line(tmp_path, capsys):
    to_hf(_perturbed(GPTConfig(**SHAPE, pos="alibi")), tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["gptlab"]["n_head"] = 5  # 32 is not divisible by 5
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "config.json" in err and "n_head" in err and "Traceback" not in err


def test_cli_round_trip_of_a_char_model_keeps_model_and_tokenizer(tmp_path):
    tok = CharTokenizer.from_text(TEXT, unk="?", special_tokens=["<|endoftext|>", "[MASK]"])
    model = _perturbed(GPTConfig(**(SHAPE | {"vocab_size": tok.vocab_size}), **DECODERS["char-best"]))
    gptlab.save(model, tok, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    back, back_tok = gptlab.load(tmp_path / "back")
    text = "Speak, zebra!<|endoftext|>[MASK]"
    assert back_tok.kind == "char" and back_tok.special_tokens == tok.special_tokens
    assert back_tok.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
    idx = torch.tensor([tok.encode(text, allowed_special="all")])
    with torch.no_grad():
        assert torch.equal(back(idx), model(idx))
