"""Qwen3 (``Qwen3ForCausalLM``) ↔ gptlab.

Qwen3 is Llama (RoPE + pre-RMSNorm + SwiGLU + grouped-query attention) plus an RMSNorm over each
head of the queries and keys before the rotation, ``q ← RMS(q_h)``, ``k ← RMS(k_h)``, with one
weight of size ``d_k`` shared by the heads and the model's ``rms_norm_eps``: gptlab's
``qk_norm=True``, applied in the same order. Its projections and MLP have no biases (only
``attention_bias`` can add q/k/v/o biases; gptlab's ``bias`` adds the MLP's too, so an exported
model has none). The tensor table is Llama's plus ``q_norm``/``k_norm``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError
from gptlab.interop import llama
from gptlab.interop.common import rule
from gptlab.model import GPTConfig


def config_from_hf(hf: dict[str, Any], path: Path) -> GPTConfig:
    """``Qwen3Config`` → ``GPTConfig``: Llama's mapping with ``qk_norm=True``; sliding windows are refused."""
    if hf.get("use_sliding_window", False):
        raise GptlabError(
            f"{path}: use_sliding_window=true is not supported (gptlab attends over the whole context)"
        )
    return llama.config_from_hf(hf, path).replace(qk_norm=True)


def config_to_hf(cfg: GPTConfig) -> dict[str, Any]:
    """``GPTConfig`` → a ``Qwen3Config`` dict (Llama's keys, no ``mlp_bias``, no sliding window)."""
    hf = llama.config_to_hf(cfg)
    del hf["mlp_bias"], hf["pretraining_tp"]
    return hf | {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.n_layer,
        "layer_types": ["full_attention"] * cfg.n_layer,
    }


_ATTN = "model.layers.{i}.self_attn."

FAMILY = dataclasses.replace(
    llama.FAMILY,
    name="Qwen3",
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    export_requires={
        **llama.FAMILY.export_requires,
        "qk_norm": (lambda c: c.qk_norm, "qk_norm=True"),
        "bias": (lambda c: not c.bias, "bias=False"),
    },
    layer_rules=(
        *llama.FAMILY.layer_rules,
        rule("blocks.{i}.attn.q_norm.weight", _ATTN + "q_norm.weight"),
        rule("blocks.{i}.attn.k_norm.weight", _ATTN + "k_norm.weight"),
    ),
)
