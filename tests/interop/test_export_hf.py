"""``to_hf`` for every decoder: transformers loads each export and computes gptlab's logits.

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

import pytest
import torch

import gptlab
from gptlab import GPTConfig, GptlabError
from gptlab.cli import main
from gptlab.generate import generate_ids
from gptlab.interop.hf import export_family, to_hf
from tests.interop._export_hf import DECODERS, SHAPE, TOL, hf_dir, load_hf, max_diff, perturbed

transformers = pytest.importorskip("transformers", reason="transformers is the reference loader")


@pytest.mark.parametrize("name", DECODERS)
def test_remote_code_decoder_matches_gptlab(name, tmp_path):
    model = perturbed(GPTConfig(**SHAPE, **DECODERS[name]))
    with pytest.raises(GptlabError):  # no transformers class computes these: remote code it is
        export_family(model.config)
    to_hf(model, hf_dir(tmp_path))
    config = json.loads((hf_dir(tmp_path) / "config.json").read_text())
    assert config["model_type"] == "gptlab" and config["architectures"] == ["GptlabForCausalLM"]
    hf = load_hf(transformers, hf_dir(tmp_path))
    idx = torch.randint(0, 61, (3, 17))
    with torch.no_grad():
        assert max_diff(hf(idx).logits, model(idx)) <= TOL


@pytest.mark.parametrize("name", ["char-best", "learned-post-layernorm-gelu-untied", "alibi-reglu-gqa"])
def test_remote_code_left_padding_matches_each_prompt_alone(name, tmp_path):
    model = perturbed(GPTConfig(**SHAPE, **DECODERS[name]))
    to_hf(model, hf_dir(tmp_path))
    hf = load_hf(transformers, hf_dir(tmp_path))
    idx = torch.randint(0, 61, (2, 12))
    mask = torch.ones_like(idx)
    mask[1, :5] = 0  # row 1: 5 padding tokens, then a 7-token prompt
    with torch.no_grad():
        logits = hf(idx, attention_mask=mask).logits
        assert max_diff(logits[0], model(idx[:1])[0]) <= TOL
        assert max_diff(logits[1, 5:], model(idx[1:, 5:])[0]) <= TOL
        out = hf.generate(idx, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert out[1, 12:].tolist() == generate_ids(model, idx[1:, 5:], 4, temperature=0)[0, 7:].tolist()


def test_remote_code_generates_with_gptlabs_kv_cache(tmp_path):
    model = perturbed(GPTConfig(**SHAPE, **DECODERS["alibi-reglu-gqa"]))
    to_hf(model, hf_dir(tmp_path))
    hf = load_hf(transformers, hf_dir(tmp_path))
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
    assert cached[0, 8:].tolist() == generate_ids(model, idx[:1, 3:], 6, temperature=0)[0, 5:].tolist()


def test_remote_code_is_forced_on_a_native_model_and_agrees(tmp_path):
    model = perturbed(GPTConfig.preset("llama-tiny", **SHAPE, n_kv_head=2))
    to_hf(model, tmp_path / "native")
    to_hf(model, hf_dir(tmp_path, "remote"), remote_code=True)
    native, remote = (
        load_hf(transformers, tmp_path / "native"),
        load_hf(transformers, hf_dir(tmp_path, "remote")),
    )
    assert type(native).__name__ == "LlamaForCausalLM" and type(remote).__name__ == "GptlabForCausalLM"
    idx = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        assert max_diff(remote(idx).logits, model(idx)) <= TOL
        assert max_diff(native(idx).logits, model(idx)) <= TOL
        # labels: transformers' convention (shifted inside, -100 ignored) gives gptlab's loss
        labels = idx.clone()
        labels[:, :3] = -100
        targets = labels[:, 1:].masked_fill(labels[:, 1:] == -100, -1)
        _, loss = model(idx[:, :-1], targets)
        assert abs(remote(idx, labels=labels).loss.item() - loss.item()) <= TOL
        assert abs(native(idx, labels=labels).loss.item() - loss.item()) <= TOL


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: ~25 s on 2 busy cores
def test_the_generated_code_loads_without_gptlab(tmp_path):
    model = perturbed(GPTConfig(**SHAPE, **DECODERS["char-best"]))
    to_hf(model, hf_dir(tmp_path))
    idx = [[3, 1, 4, 1, 5, 9, 2, 6]]
    script = f"""
import importlib.abc, sys
class NoGptlab(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "gptlab":
            raise ImportError("gptlab is not installed here")
sys.meta_path.insert(0, NoGptlab())
import torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained({str(hf_dir(tmp_path))!r}, trust_remote_code=True,
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
        assert max_diff(theirs, model(torch.tensor(idx))[0, -1]) <= TOL


def test_the_generated_code_is_gptlab_source(tmp_path):
    """Each generated file is its gptlab module line for line, except the lines that name gptlab."""
    from gptlab.interop.remote_source import flat_name, model_modules

    to_hf(perturbed(GPTConfig(**SHAPE)), hf_dir(tmp_path), remote_code=True)
    modules = model_modules()
    assert {"gptlab.model.attention", "gptlab.model.positional", "gptlab.model.encdec"} <= set(modules)
    for module, path in modules.items():
        ours = path.read_text(encoding="utf-8").splitlines()
        generated = (
            (hf_dir(tmp_path) / f"{flat_name(module)}.py").read_text(encoding="utf-8").splitlines()[1:]
        )
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
    model = perturbed(GPTConfig(**SHAPE, **QWEN3, **extra))
    assert export_family(model.config).architecture == "Qwen3ForCausalLM"
    to_hf(model, hf_dir(tmp_path))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(hf_dir(tmp_path)), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    idx = torch.randint(0, 61, (2, 15))
    with torch.no_grad():
        assert max_diff(hf(idx).logits, model(idx)) <= TOL


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
    hf.save_pretrained(hf_dir(tmp_path))
    ours = gptlab.from_hf(hf_dir(tmp_path))
    assert ours.config.qk_norm and ours.config.bias == attention_bias
    idx = torch.randint(0, 61, (2, 11))
    with torch.no_grad():
        assert max_diff(ours(idx), hf(idx).logits) <= TOL


def test_the_default_recipe_loads_in_transformers(tmp_path):
    from gptlab.train.config import TrainConfig, read_config_file

    data = read_config_file("char-best")
    config = TrainConfig.from_dict({k: v for k, v in data.items() if k != "model"} | {"model": data["model"]})
    model = perturbed(config.model_config(65))
    to_hf(model, hf_dir(tmp_path))
    hf = load_hf(transformers, hf_dir(tmp_path))
    idx = torch.randint(0, 65, (2, 64))
    with torch.no_grad():
        assert max_diff(hf(idx).logits, model(idx)) <= TOL


def test_cli_names_what_it_wrote(tmp_path, capsys):
    for name, options in (("remote", DECODERS["alibi-reglu-gqa"]), ("qwen3", QWEN3)):
        gptlab.save(perturbed(GPTConfig(**SHAPE, **options)), None, tmp_path / name)
        assert main(["convert", "--to-hf", str(tmp_path / name), "--out", str(tmp_path / f"{name}-hf")]) == 0
    out = capsys.readouterr().out
    assert "GptlabForCausalLM remote code (AutoModelForCausalLM, trust_remote_code=True)" in out
    assert "Qwen3ForCausalLM (AutoModelForCausalLM)" in out


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_from_hf_reads_a_remote_code_folder_back(arch, tmp_path):
    model = perturbed(GPTConfig(**SHAPE, arch=arch, **DECODERS["char-best"]))
    to_hf(model, hf_dir(tmp_path))
    back = gptlab.from_hf(hf_dir(tmp_path))
    assert back.config.to_dict() == model.config.to_dict()
    idx = torch.randint(0, 61, (2, 9))
    kw = {"source": idx} if arch == "encoder-decoder" else {}
    with torch.no_grad():
        assert torch.equal(back.run(idx, **kw).logits, model.run(idx, **kw).logits)


def test_a_broken_remote_code_folder_is_one_error_line(tmp_path, capsys):
    to_hf(perturbed(GPTConfig(**SHAPE, pos="alibi")), hf_dir(tmp_path))
    config = json.loads((hf_dir(tmp_path) / "config.json").read_text())
    config["gptlab"]["n_head"] = 5  # 32 is not divisible by 5
    (hf_dir(tmp_path) / "config.json").write_text(json.dumps(config))
    assert main(["convert", "--from-hf", str(hf_dir(tmp_path)), "--out", str(tmp_path / "ckpt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "config.json" in err and "n_head" in err and "Traceback" not in err
