"""Small synthetic GGUF files, written with ``gguf.GGUFWriter`` as llama.cpp's converter writes them
(llama.cpp's RoPE row permutation, GPT-2's transposed matrices): what the GGUF import tests share."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import quantize  # noqa: E402

from gptlab import GPT, GPTConfig  # noqa: E402
from gptlab.checkpoint import model_state  # noqa: E402
from gptlab.interop import gpt2, llama  # noqa: E402
from gptlab.interop.common import export_state  # noqa: E402
from gptlab.tokenizers.byte_unicode import bytes_to_token  # noqa: E402

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


def finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_llama(
    path, model: GPT, qtype: Q = Q.F32, extra_tensor: str | None = None, table: Q | None = None, **meta
) -> None:
    """A llama GGUF file of ``model``: its matrices in ``qtype``, the token table in ``table`` (default
    ``qtype``), 1-D tensors F32."""
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
        kind = table if table is not None and name == "token_embd.weight" else qtype
        if a.ndim == 2 and kind != Q.F32:
            w.add_tensor(name, quantize(a, kind), raw_dtype=kind)  # the shape: from the bytes per row
        else:
            w.add_tensor(name, np.ascontiguousarray(a))
    if extra_tensor:
        w.add_tensor(extra_tensor, np.ones(cfg.head_dim // 2, dtype=np.float32))
    finish(w)


def tiny_llama(tie: bool = True, seed: int = 0, vocab_size: int = 270) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=vocab_size, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, d_ff=96, pos="rope",
        rope_theta=5000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False, tie_embeddings=tie,
    )  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():  # norms away from 1 so a mix-up shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


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
    finish(w)
