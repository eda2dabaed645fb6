"""GPT-2 (``GPT2LMHeadModel``) ↔ gptlab.

GPT-2 is learned positions + pre-LayerNorm + a GELU-tanh MLP + multi-head
attention with biases. Its ``Conv1D`` layers store ``W`` as ``(in, out)`` (``y =
x·W + b``), so every projection is transposed into our ``nn.Linear`` ``(out, in)``;
``c_attn`` already fuses ``[W_Q | W_K | W_V]`` in the order of our ``attn.qkv``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError
from gptlab.interop.common import TRANSPOSE, Family, rule
from gptlab.model import GPTConfig

#: Hugging Face ``activation_function`` → gptlab ``mlp``. ``gelu_new`` is GPT-2's tanh approximation.
ACT_FROM_HF = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
ACT_TO_HF = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}

#: GPT-2 options that change the computation in ways gptlab does not implement: name → the value we need.
UNSUPPORTED_FLAGS = {
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "scale_attn_weights": True,
    "add_cross_attention": False,
}


def _need(hf: dict[str, Any], key: str, path: Path) -> Any:
    if key not in hf:
        raise GptlabError(f"{path}: missing {key!r} (needed for a GPT-2 model)")
    return hf[key]


def config_from_hf(hf: dict[str, Any], path: Path) -> GPTConfig:
    """``GPT2Config`` → ``GPTConfig`` (positions ``n_positions``, width ``n_inner`` or ``4·n_embd``)."""
    for key, wanted in UNSUPPORTED_FLAGS.items():
        if hf.get(key, wanted) != wanted:
            raise GptlabError(
                f"{path}: {key}={hf[key]!r} is not supported by gptlab (it needs {key}={wanted})"
            )
    act = hf.get("activation_function", "gelu_new")
    if act not in ACT_FROM_HF:
        raise GptlabError(
            f"{path}: activation_function={act!r} is not supported; gptlab reads {', '.join(ACT_FROM_HF)}"
        )
    n_embd = _need(hf, "n_embd", path)
    return GPTConfig.from_dict(
        dict(
            vocab_size=_need(hf, "vocab_size", path),
            block_size=_need(hf, "n_positions", path),
            n_layer=_need(hf, "n_layer", path),
            n_head=_need(hf, "n_head", path),
            n_embd=n_embd,
            d_ff=hf.get("n_inner") or 4 * n_embd,
            pos="learned",
            norm="layernorm",
            norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            norm_placement="pre",
            mlp=ACT_FROM_HF[act],
            bias=True,
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
            dropout=0.0,
            extra=_extra(hf),
        )
    )


def _extra(hf: dict[str, Any]) -> dict[str, Any]:
    return {
        "hf_model_type": hf.get("model_type"),
        "bos_token_id": hf.get("bos_token_id"),
        "eos_token_id": hf.get("eos_token_id"),
    }


def config_to_hf(cfg: GPTConfig) -> dict[str, Any]:
    """``GPTConfig`` → a ``GPT2Config`` dict."""
    eos = cfg.extra.get("eos_token_id", 50256 if cfg.vocab_size > 50256 else None)
    bos = cfg.extra.get("bos_token_id", eos)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.d_ff,
        "activation_function": ACT_TO_HF[cfg.mlp],
        "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "use_cache": True,
    }


FAMILY = Family(
    name="GPT-2",
    model_type="gpt2",
    architecture="GPT2LMHeadModel",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    export_requires={
        "pos": (lambda c: c.pos == "learned", "pos='learned'"),
        "norm": (lambda c: c.norm == "layernorm", "norm='layernorm'"),
        "norm_placement": (lambda c: c.norm_placement == "pre", "norm_placement='pre'"),
        "mlp": (lambda c: c.mlp in ACT_TO_HF, "mlp=" + " or ".join(repr(m) for m in ACT_TO_HF)),
        "n_kv_head": (lambda c: c.n_kv_head == c.n_head, "n_kv_head=n_head"),
        "bias": (lambda c: c.bias, "bias=True"),
        "qk_norm": (lambda c: not c.qk_norm, "qk_norm=False"),
        "logit_softcap": (lambda c: c.logit_softcap is None, "logit_softcap=None"),
        "n_experts": (lambda c: c.n_experts == 0, "n_experts=0"),
    },
    rules=(
        rule("wte.weight", "transformer.wte.weight"),
        rule("positional.wpe.weight", "transformer.wpe.weight"),
        rule("norm_f.weight", "transformer.ln_f.weight"),
        rule("norm_f.bias", "transformer.ln_f.bias"),
        rule("lm_head.weight", "lm_head.weight"),
    ),
    layer_rules=(
        rule("blocks.{i}.norm1.weight", "transformer.h.{i}.ln_1.weight"),
        rule("blocks.{i}.norm1.bias", "transformer.h.{i}.ln_1.bias"),
        rule("blocks.{i}.attn.qkv.weight", "transformer.h.{i}.attn.c_attn.weight", transform=TRANSPOSE),
        rule("blocks.{i}.attn.qkv.bias", "transformer.h.{i}.attn.c_attn.bias"),
        rule("blocks.{i}.attn.proj.weight", "transformer.h.{i}.attn.c_proj.weight", transform=TRANSPOSE),
        rule("blocks.{i}.attn.proj.bias", "transformer.h.{i}.attn.c_proj.bias"),
        rule("blocks.{i}.norm2.weight", "transformer.h.{i}.ln_2.weight"),
        rule("blocks.{i}.norm2.bias", "transformer.h.{i}.ln_2.bias"),
        rule("blocks.{i}.mlp.fc.weight", "transformer.h.{i}.mlp.c_fc.weight", transform=TRANSPOSE),
        rule("blocks.{i}.mlp.fc.bias", "transformer.h.{i}.mlp.c_fc.bias"),
        rule("blocks.{i}.mlp.proj.weight", "transformer.h.{i}.mlp.c_proj.weight", transform=TRANSPOSE),
        rule("blocks.{i}.mlp.proj.bias", "transformer.h.{i}.mlp.c_proj.bias"),
    ),
    prefix="transformer.",
    ignore=(".attn.bias", ".attn.masked_bias"),  # causal-mask buffers of old checkpoints
)
