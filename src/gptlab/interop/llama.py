"""Llama (``LlamaForCausalLM``) ↔ gptlab.

Llama is RoPE + pre-RMSNorm + a SwiGLU MLP + grouped-query attention, without
biases by default. ``q_proj``, ``k_proj``, ``v_proj`` are concatenated into our
fused ``attn.qkv`` (rows ``[q | k | v]``). Hugging Face's rotary embedding pairs
feature ``i`` with ``i + d_k/2`` ("rotate half"), which is what our
``RotaryPositions`` does, so no permutation of the q/k rows is needed.
``gate_proj``/``up_proj``/``down_proj`` are our ``mlp.gate``/``mlp.up``/``mlp.proj``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError
from gptlab.interop.common import FUSE_QKV, Family, rule
from gptlab.model import GPTConfig

SUPPORTED_ROPE_TYPES = ("default",)


def _need(hf: dict[str, Any], key: str, path: Path) -> Any:
    if key not in hf:
        raise GptlabError(f"{path}: missing {key!r} (needed for a Llama model)")
    return hf[key]


def rope_theta_from_hf(hf: dict[str, Any], path: Path) -> float:
    """The RoPE base ``θ``, from ``rope_parameters`` (transformers 5) or ``rope_theta``/``rope_scaling`` (4.x).

    Only plain RoPE is supported: a scaled variant (linear, dynamic, yarn, llama3, …)
    changes the angles, so it is an error rather than a silently different model.
    """
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise GptlabError(f"{path}: rope_parameters / rope_scaling must be JSON objects")
    for source, table in (("rope_parameters", params), ("rope_scaling", scaling)):
        kind = table.get("rope_type", table.get("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise GptlabError(
                f"{path}: {source} has rope_type={kind!r}, which gptlab does not implement; "
                f"it supports plain RoPE only (rope_type 'default', no rope_scaling)"
            )
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise GptlabError(
            f"{path}: partial_rotary_factor={factor} is not supported (gptlab rotates the whole head)"
        )
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def config_from_hf(hf: dict[str, Any], path: Path) -> GPTConfig:
    """``LlamaConfig`` → ``GPTConfig``. Biases: either of ``attention_bias``/``mlp_bias`` turns ``bias`` on,
    and the other part's biases are imported as zeros (the same function)."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise GptlabError(
            f"{path}: hidden_act={act!r} is not supported; a Llama MLP in gptlab is SwiGLU (silu)"
        )
    n_embd, n_head = _need(hf, "hidden_size", path), _need(hf, "num_attention_heads", path)
    head_dim = hf.get("head_dim")
    if head_dim is not None and isinstance(n_head, int) and n_head > 0 and head_dim * n_head != n_embd:
        raise GptlabError(
            f"{path}: head_dim={head_dim} × num_attention_heads={n_head} ≠ hidden_size={n_embd}; "
            f"gptlab needs head_dim = hidden_size / num_attention_heads"
        )
    return GPTConfig.from_dict(
        dict(
            vocab_size=_need(hf, "vocab_size", path),
            block_size=hf.get("max_position_embeddings", 2048),
            n_layer=_need(hf, "num_hidden_layers", path),
            n_head=n_head,
            n_kv_head=hf.get("num_key_value_heads") or n_head,
            n_embd=n_embd,
            d_ff=_need(hf, "intermediate_size", path),
            pos="rope",
            rope_theta=rope_theta_from_hf(hf, path),
            norm="rmsnorm",
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            norm_placement="pre",
            mlp="swiglu",
            bias=bool(hf.get("attention_bias", False) or hf.get("mlp_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dropout=0.0,
            extra={
                "hf_model_type": hf.get("model_type"),
                "bos_token_id": hf.get("bos_token_id"),
                "eos_token_id": hf.get("eos_token_id"),
            },
        )
    )


def config_to_hf(cfg: GPTConfig) -> dict[str, Any]:
    """``GPTConfig`` → a ``LlamaConfig`` dict (both the 5.x ``rope_parameters`` and the 4.x ``rope_theta``)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.block_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "attention_dropout": cfg.dropout,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "bos_token_id": cfg.extra.get("bos_token_id"),
        "eos_token_id": cfg.extra.get("eos_token_id"),
        "pretraining_tp": 1,
        "use_cache": True,
    }


_ATTN = "model.layers.{i}.self_attn."
_MLP = "model.layers.{i}.mlp."

FAMILY = Family(
    name="Llama",
    model_type="llama",
    architecture="LlamaForCausalLM",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    export_requires={
        "pos": (lambda c: c.pos == "rope", "pos='rope'"),
        "norm": (lambda c: c.norm == "rmsnorm", "norm='rmsnorm'"),
        "norm_placement": (lambda c: c.norm_placement == "pre", "norm_placement='pre'"),
        "mlp": (lambda c: c.mlp == "swiglu", "mlp='swiglu'"),
        "qk_norm": (lambda c: not c.qk_norm, "qk_norm=False"),
        "logit_softcap": (lambda c: c.logit_softcap is None, "logit_softcap=None"),
        "n_experts": (lambda c: c.n_experts == 0, "n_experts=0"),
    },
    rules=(
        rule("wte.weight", "model.embed_tokens.weight"),
        rule("norm_f.weight", "model.norm.weight"),
        rule("lm_head.weight", "lm_head.weight"),
    ),
    layer_rules=(
        rule("blocks.{i}.norm1.weight", "model.layers.{i}.input_layernorm.weight"),
        rule(
            "blocks.{i}.attn.qkv.weight",
            _ATTN + "q_proj.weight",
            _ATTN + "k_proj.weight",
            _ATTN + "v_proj.weight",
            transform=FUSE_QKV,
        ),
        rule(
            "blocks.{i}.attn.qkv.bias",
            _ATTN + "q_proj.bias",
            _ATTN + "k_proj.bias",
            _ATTN + "v_proj.bias",
            transform=FUSE_QKV,
            zero_if_absent=True,
        ),
        rule("blocks.{i}.attn.proj.weight", _ATTN + "o_proj.weight"),
        rule("blocks.{i}.attn.proj.bias", _ATTN + "o_proj.bias", zero_if_absent=True),
        rule("blocks.{i}.norm2.weight", "model.layers.{i}.post_attention_layernorm.weight"),
        rule("blocks.{i}.mlp.gate.weight", _MLP + "gate_proj.weight"),
        rule("blocks.{i}.mlp.gate.bias", _MLP + "gate_proj.bias", zero_if_absent=True),
        rule("blocks.{i}.mlp.up.weight", _MLP + "up_proj.weight"),
        rule("blocks.{i}.mlp.up.bias", _MLP + "up_proj.bias", zero_if_absent=True),
        rule("blocks.{i}.mlp.proj.weight", _MLP + "down_proj.weight"),
        rule("blocks.{i}.mlp.proj.bias", _MLP + "down_proj.bias", zero_if_absent=True),
    ),
    prefix="model.",
    ignore=(".rotary_emb.inv_freq",),  # a recomputed buffer some old checkpoints saved
)
