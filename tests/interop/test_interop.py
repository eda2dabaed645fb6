"""Hugging Face interop: parity with transformers in both directions, the CLI, and bad input.

transformers is imported once for the module (it is slow); the reference models
are built once and saved to a module-scoped temporary folder. Every parameter is
perturbed after transformers' initialisation (which sets norms to 1 and biases to
0) so that a swapped or dropped tensor changes the logits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import gptlab
from gptlab import GPT, GPTConfig, GptlabError
from gptlab.cli import main
from gptlab.interop import export_family
from tests._tiny import tiny_model

VOCAB = 101
TOL = 1e-4

transformers = pytest.importorskip("transformers")  # a dev dependency (pyproject [dev])


def _perturb(model: torch.nn.Module, scale: float = 0.1) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)


def _gpt2(**kw):
    cfg = dict(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        initializer_range=0.2,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
    )
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**(cfg | kw)))


def _llama(**kw):
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**(cfg | kw)))


#: name → (builder, how it is saved). GQA Llama untied (the default), MQA Llama tied with attention biases.
CASES = {
    "gpt2": (lambda: _gpt2(), "safetensors"),
    "gpt2-untied-relu": (
        lambda: _gpt2(tie_word_embeddings=False, activation_function="relu", n_inner=48),
        "safetensors",
    ),
    "gpt2-bin": (lambda: _gpt2(activation_function="gelu"), "bin"),
    "gpt2-bare": (lambda: _gpt2(layer_norm_epsilon=1e-6), "bare"),
    "llama-gqa": (lambda: _llama(), "safetensors"),
    "llama-gqa-sharded": (lambda: _llama(tie_word_embeddings=False), "sharded"),
    "llama-bin": (lambda: _llama(), "bin"),
    "llama-tied-mqa-bias": (
        lambda: _llama(tie_word_embeddings=True, num_key_value_heads=1, attention_bias=True),
        "safetensors",
    ),
}


def _save(model, directory: Path, how: str) -> None:
    if (
        how == "bin"
    ):  # transformers 5 always writes safetensors; the legacy format is a torch.save'd state dict
        model.save_pretrained(directory)
        (directory / "model.safetensors").unlink()
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
    elif how == "bare":  # the layout of the original GPT-2 files: GPT2Model names, mask buffers, no lm_head
        model.save_pretrained(directory)
        state = {
            k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"
        }
        n = model.config.n_positions
        for i in range(model.config.n_layer):
            state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        save_file({k: v.contiguous() for k, v in state.items()}, directory / "model.safetensors")
    elif how == "sharded":
        model.save_pretrained(directory, max_shard_size="20KB")
        assert (directory / "model.safetensors.index.json").exists()
    else:
        model.save_pretrained(directory)


@pytest.fixture(scope="module")
def idx() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, 16), generator=g)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, idx) -> dict[str, tuple[Path, torch.Tensor]]:
    """Each case saved by transformers, with its reference logits on ``idx``."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for i, (name, (build, how)) in enumerate(CASES.items()):
        torch.manual_seed(i)
        model = build().eval()
        _perturb(model)
        with torch.no_grad():
            logits = model(idx).logits
        assert logits.std() > 0.3  # not trivially ~0: a wrong mapping would show
        _save(model, root / name, how)
        out[name] = (root / name, logits)
    return out


def _hf_logits(directory: Path, idx: torch.Tensor, architecture: str | None = None) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    if architecture is not None:
        assert type(model).__name__ == architecture
    with torch.no_grad():
        return model(idx).logits


ARCH = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


# ---------------------------------------------------------------- parity
@pytest.mark.parametrize("name", list(CASES))
def test_import_then_export_matches_transformers(name, saved, idx, tmp_path):
    directory, ref = saved[name]
    model = gptlab.from_hf(directory)
    with torch.no_grad():
        ours = model(idx)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=TOL, rtol=0)

    out = gptlab.to_hf(model, tmp_path / "export")
    back = _hf_logits(out, idx, ARCH[name.split("-")[0]])
    torch.testing.assert_close(back, ref, atol=TOL, rtol=0)


def test_imported_config_follows_the_hf_config(saved):
    llama = gptlab.from_hf(saved["llama-gqa"][0]).config
    assert (llama.pos, llama.norm, llama.mlp, llama.n_head, llama.n_kv_head) == (
        "rope",
        "rmsnorm",
        "swiglu",
        4,
        2,
    )
    assert (llama.rope_theta, llama.norm_eps, llama.d_ff, llama.tie_embeddings, llama.bias) == (
        500.0,
        1e-5,
        48,
        False,
        False,
    )
    gpt2 = gptlab.from_hf(saved["gpt2-untied-relu"][0]).config
    assert (gpt2.pos, gpt2.mlp, gpt2.d_ff, gpt2.tie_embeddings, gpt2.block_size) == (
        "learned",
        "relu",
        48,
        False,
        32,
    )
    tied = gptlab.from_hf(saved["llama-tied-mqa-bias"][0])
    assert tied.config.n_kv_head == 1 and tied.config.tie_embeddings
    assert tied.lm_head.weight.data_ptr() == tied.wte.weight.data_ptr()
    # attention_bias without mlp_bias: the MLP biases are imported as zeros (the same function)
    assert torch.count_nonzero(tied.blocks[0].mlp.up.bias) == 0
    assert torch.count_nonzero(tied.blocks[0].attn.qkv.bias) > 0


def _native(name: str, **overrides) -> GPT:
    """A shrunk preset with large random weights (and perturbed norms) so logits are far from uniform."""
    small = dict(vocab_size=VOCAB, block_size=32, n_layer=2, n_embd=64, init_std=0.3)
    torch.manual_seed(7)
    model = GPT(GPTConfig.preset(name, **(small | overrides))).eval()
    _perturb(model)
    return model


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("llama-tiny", dict(n_head=4, n_kv_head=2, rope_theta=1000.0)),  # untied, GQA
        ("llama-tiny", dict(n_head=4, n_kv_head=4, tie_embeddings=True, bias=True)),
        ("gpt2", dict(n_head=4)),
        ("char-tiny", dict(n_head=4, tie_embeddings=False)),  # exact GELU
    ],
)
def test_native_model_round_trips_through_transformers(preset, overrides, idx, tmp_path):
    model = _native(preset, **overrides)
    with torch.no_grad():
        ref = model(idx)
    out = gptlab.to_hf(model, tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    torch.testing.assert_close(_hf_logits(out, idx), ref, atol=TOL, rtol=0)
    again = gptlab.from_hf(out)
    assert again.config.to_dict() | {"extra": {}, "init_std": 0} == model.config.to_dict() | {
        "extra": {},
        "init_std": 0,
    }
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------- what cannot be exported
@pytest.mark.parametrize(
    "option",
    [
        dict(pos="alibi"),
        dict(pos="sinusoidal"),
        dict(pos="none"),
        dict(norm_placement="post"),
        dict(mlp="relu2"),
        dict(qk_norm=True),
        dict(logit_softcap=30.0),
        dict(n_experts=2),
        dict(n_kv_head=2),
        dict(bias=False),
    ],
)
def test_options_without_a_transformers_class_are_exported_as_remote_code(option, tmp_path):
    model = tiny_model(vocab_size=VOCAB, block_size=16, n_layer=1, **option)
    with pytest.raises(GptlabError) as err:  # no native class: the reason names every family's needs
        export_family(model.config)
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg and "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg
    name = next(iter(option))
    assert f"{name}=" in msg
    gptlab.to_hf(
        model, tmp_path / "out"
    )  # the model's own code instead (tests/interop/test_export_hf.py loads it)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "gptlab" and config["auto_map"]["AutoModelForCausalLM"]


def test_llama_with_qk_norm_exports_as_qwen3(tmp_path):
    model = _native("llama-tiny", n_head=4, qk_norm=True)
    gptlab.to_hf(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


# ---------------------------------------------------------------- bad input
def _edit_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "case, breaks, names",
    [
        ("gpt2", lambda d: (d / "config.json").unlink(), "config.json"),
        ("gpt2", lambda d: (d / "model.safetensors").unlink(), "model.safetensors"),
        ("gpt2", lambda d: _truncate(d / "model.safetensors"), "model.safetensors"),
        ("gpt2-bin", lambda d: _truncate(d / "pytorch_model.bin"), "pytorch_model.bin"),
        ("gpt2", lambda d: (d / "config.json").write_text("{not json"), "config.json"),
        (
            "llama-gqa-sharded",
            lambda d: sorted(d.glob("model-*-of-*.safetensors"))[1].unlink(),
            r"model-00002-of-\d+",
        ),
    ],
)
def test_broken_files_name_the_file(case, breaks, names, saved, tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(saved[case][0], d)
    breaks(d)
    with pytest.raises(GptlabError, match=names):
        gptlab.from_hf(d)


@pytest.mark.parametrize(
    "case, changes, match",
    [
        ("gpt2", dict(model_type="bert"), "model_type 'bert' is not supported"),
        ("gpt2", dict(n_embd=64), r"config.json.*\(101, 64\)|model.safetensors.*\(101, 64\)"),
        ("gpt2", dict(n_layer=3), "missing tensor transformer.h.2"),
        ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        ("gpt2", dict(reorder_and_upcast_attn=True), "reorder_and_upcast_attn"),
        ("gpt2", dict(activation_function="gelu_fast"), "activation_function='gelu_fast'"),
        (
            "llama-gqa",
            dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}),
            "llama3",
        ),
        ("llama-gqa", dict(rope_scaling={"type": "linear", "factor": 2.0}), "linear"),
        ("llama-gqa", dict(hidden_act="gelu"), "hidden_act='gelu'"),
        ("llama-gqa", dict(num_key_value_heads=3), "n_kv_head"),
    ],
)
def test_unsupported_or_mismatched_configs_are_clear_errors(case, changes, match, saved, tmp_path):
    d = _edit_config(saved[case][0], tmp_path / "edited", **changes)
    with pytest.raises(GptlabError, match=match) as err:
        gptlab.from_hf(d)
    assert str(d) in str(err.value)


def test_a_gptlab_checkpoint_is_not_a_hf_directory(tmp_path):
    model = _native("gpt2", n_head=4)
    gptlab.save(model, None, tmp_path / "ckpt")
    with pytest.raises(GptlabError, match="gptlab checkpoint"):
        gptlab.from_hf(tmp_path / "ckpt")
    with pytest.raises(GptlabError, match="gptlab checkpoint"):
        gptlab.to_hf(model, tmp_path / "ckpt")  # would overwrite its config.json


# ---------------------------------------------------------------- CLI
def test_cli_converts_both_ways(saved, idx, tmp_path, capsys):
    directory, ref = saved["llama-gqa"]
    ckpt, back = tmp_path / "ckpt", tmp_path / "back"
    assert main(["convert", "--from-hf", str(directory), "--out", str(ckpt)]) == 0
    model, tok = gptlab.load(ckpt)
    assert tok is None
    with torch.no_grad():
        torch.testing.assert_close(model(idx), ref, atol=TOL, rtol=0)
    assert main(["convert", "--to-hf", str(ckpt), "--out", str(back)]) == 0
    torch.testing.assert_close(_hf_logits(back, idx, "LlamaForCausalLM"), ref, atol=TOL, rtol=0)
    assert "LlamaForCausalLM" in capsys.readouterr().out


def test_cli_from_hf_keeps_the_gpt2_tokenizer(saved, gpt2_files, tmp_path):
    from gptlab.tokenizers import GPT2Tokenizer

    vocab_bpe, encoder_json = gpt2_files
    from transformers import GPT2Config, GPT2LMHeadModel

    src = tmp_path / "hf"  # the tokenizer's 50257 ids must fit the model's vocabulary
    hf_config = GPT2Config(vocab_size=50257, n_positions=32, n_embd=8, n_layer=1, n_head=2)
    GPT2LMHeadModel(hf_config).save_pretrained(src, safe_serialization=True)
    shutil.copy(vocab_bpe, src / "merges.txt")  # Hugging Face's names for the same two files
    shutil.copy(encoder_json, src / "vocab.json")
    assert main(["convert", "--from-hf", str(src), "--out", str(tmp_path / "ckpt")]) == 0
    _, tok = gptlab.load(tmp_path / "ckpt")
    text = "Hello world, the cat sat on the mat."
    assert tok is not None and tok.encode(text) == GPT2Tokenizer.from_files(vocab_bpe, encoder_json).encode(
        text
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--from-hf", "{missing}", "--out", "{out}"],
        ["--to-hf", "{missing}", "--out", "{out}"],  # no model there (any source exports: a HF folder too)
        ["--from-hf", "{hf}", "--out", "{hf}"],  # the output exists and is not empty
        ["--from-hf", "{hf}"],  # --out is required
    ],
)
def test_cli_bad_input_is_one_error_line(argv, saved, tmp_path, capsys):
    paths = {"missing": tmp_path / "nope", "out": tmp_path / "out", "hf": saved["gpt2"][0]}
    args = ["convert", *(a.format(**paths) for a in argv)]
    try:
        code = main(args)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_exports_a_model_without_a_transformers_class_as_remote_code(tmp_path, capsys):
    model = tiny_model(vocab_size=VOCAB, block_size=16, n_layer=1, pos="alibi")
    gptlab.save(model, None, tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")]) == 0
    assert "GptlabForCausalLM remote code" in capsys.readouterr().out
    assert (tmp_path / "out" / "modeling_gptlab.py").is_file()
