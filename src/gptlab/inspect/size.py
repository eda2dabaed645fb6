"""How big is a model, and what does it cost? Every figure with the formula it comes from.

Symbols: ``V`` vocabulary, ``T_max`` context length (block_size), ``d`` = d_model,
``L`` layers, ``H`` query heads, ``H_kv`` key/value heads, ``d_k = d/H``,
``d_ff`` feed-forward width, ``E`` experts (``k`` active), ``T`` the context
asked about, ``B`` the batch, ``b`` bytes per number.

Parameters (blueprint "Model Hyperparameters and Complexity", "Parameter Analysis"):

    embeddings    V·d                          (the head reuses W_e when tied, eq. 9)
    attention     L·((2 + 2·H_kv/H)·d² + biases)   = L·4·d² for multi-head attention
    feed-forward  L·(2·d·d_ff + biases)        = L·8·d² at d_ff = 4d;  gated: L·3·d·d_ff
    norms         γ (and β) of each LayerNorm / RMSNorm

Compute per token (Kaplan et al. 2020, ``gptlab.inspect.flops``): forward ``2·N + 2·L·T·d`` FLOPs,
where ``N`` counts the weights a token multiplies; training ≈ 3× forward (backward ≈ 2× forward).
An encoder's queries read all T keys (``4·L·T·d``); an encoder–decoder's figures are per target
token and add cross-attention over ``S`` source tokens and the encoder's share.
KV cache: ``2·L·B·H_kv·T·d_k·b`` bytes (blueprint "Stage 5: KV Cache Operations"). An encoder
keeps none (nothing is generated); an encoder–decoder adds the cross-attention ``K_enc, V_enc``,
``2·L·B·H_kv·S·d_k·b`` bytes computed once per source.
Training memory with AdamW: weights + gradients + two moments + activations.

    figures.py  the report's figures and number formats
    params.py   the parameter counts
    flops.py    FLOPs per token (shared with the training loop's MFU) and device peaks
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gptlab.errors import GptlabError
from gptlab.inspect.figures import DTYPES, KV_DTYPES, Figure, SizeReport, dtype_name
from gptlab.inspect.flops import compute_figures
from gptlab.inspect.params import parameter_figures
from gptlab.model.config import GPTConfig

if TYPE_CHECKING:
    from gptlab.model import GPT

# bytes of activations each layer stores per token, per (16-bit) number (Korthikanti et al. 2022):
#   s·b·h·(34 + 5·a·s/h) bytes at 16 bits, i.e. (34 + 5·H·T/d)/2 numbers per token and d.
_ACT_LINEAR = 34
_ACT_SCORES = 5


# ---------------------------------------------------------------- everything
def size_report(
    config: GPTConfig,
    context: int | None = None,
    batch: int = 1,
    dtype: str = "fp32",
    name: str = "",
    kv_dtype: str | None = None,
    source: int | None = None,
) -> SizeReport:
    """Parameters, FLOPs per token, KV-cache bytes and AdamW training memory of ``config``.

    ``context`` (default ``block_size``) is the number of tokens ``T`` the costs are for,
    ``batch`` the batch size ``B``, ``dtype`` the number format (``fp32``, ``fp16``, ``bf16``),
    ``kv_dtype`` the KV-cache storage (default ``dtype``; also ``int8``, with a float32 scale per vector),
    ``source`` the source length ``S`` of an encoder–decoder (default ``T``).
    """
    if not isinstance(config, GPTConfig):
        raise GptlabError(f"size_report needs a GPTConfig, got {type(config).__name__}")
    T = config.block_size if context is None else context
    if not isinstance(T, int) or T <= 0:
        raise GptlabError(f"context must be a positive number of tokens, got {context!r}")
    S = T if source is None else source
    if not isinstance(S, int) or S <= 0:
        raise GptlabError(f"source must be a positive number of tokens, got {source!r}")
    if not isinstance(batch, int) or batch <= 0:
        raise GptlabError(f"batch must be a positive integer, got {batch!r}")
    dt = dtype_name(dtype)
    b = DTYPES[dt][1]
    kv_dt = dtype_name(kv_dtype if kv_dtype is not None else dt, KV_DTYPES, "KV-cache dtype")
    _, b_kv, scale_bytes = KV_DTYPES[kv_dt]
    c = config
    L, d, H, Hkv, dk, V = c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.vocab_size
    assert Hkv is not None
    symbols: dict[str, int | str] = {
        "V": V,
        "T_max": c.block_size,
        "d": d,
        "L": L,
        "H": H,
        "H_kv": Hkv,
        "d_k": dk,
        "d_ff": c.d_ff or 0,
    }
    if c.n_experts:
        symbols.update(E=c.n_experts, k=c.experts_top_k)
    if c.arch == "encoder-decoder":
        symbols.update(L_enc=c.n_encoder_layer or 0, S=S)
    symbols.update(T=T, B=batch, b=f"{b} ({dt})")
    if kv_dt != dt:
        symbols["b_kv"] = f"{b_kv} ({kv_dt})"
    kv_kind = "MHA" if Hkv == H else ("MQA" if Hkv == 1 else "GQA")
    title = (
        f"{name + ': ' if name else ''}{L} layers, d_model={d}, {H} heads ({Hkv} KV heads, {kv_kind}), "
        f"d_ff={c.d_ff} {c.mlp}{f' ×{c.n_experts} experts' if c.n_experts else ''}, "
        f"pos={c.pos}, vocab {V}, context {c.block_size}" + ("" if c.arch == "decoder" else f", {c.arch}")
    )
    report = SizeReport(config=c.to_dict(), symbols=symbols, title=title)
    report.parameters, counts = parameter_figures(c)
    total = counts["total"]
    report.compute = compute_figures(c, T, batch, S)
    report.kv_cache = KV_CACHES[c.arch](c, T, S, batch, dt, kv_dt)

    L = L + (c.n_encoder_layer or 0)  # an encoder–decoder stores both stacks' activations
    layers = "(L + L_enc)" if c.n_encoder_layer else "L"
    act_layer = L * batch * T * d * (_ACT_LINEAR + _ACT_SCORES * H * T / d) * b / 2
    act_logits = batch * T * V * (b + 4)
    acts = int(act_layer + act_logits)
    weights = total * b
    report.training_memory = [
        Figure("weights", weights, "bytes", "P·b", f"{total}·{b}", "P = total parameters"),
        Figure("gradients", weights, "bytes", "P·b", f"{total}·{b}"),
        Figure(
            "optimizer (2 moments)",
            2 * weights,
            "bytes",
            "2·P·b",
            f"2·{total}·{b}",
            "AdamW's m and v, kept in the parameter dtype",
        ),
        Figure(
            "activations (estimate)",
            acts,
            "bytes",
            f"{layers}·B·T·d·(34 + 5·H·T/d)·b/2 + B·T·V·(b + 4)",
            f"{L}·{batch}·{T}·{d}·(34 + 5·{H}·{T}/{d})·{b}/2 + {batch}·{T}·{V}·({b} + 4)",
            "Korthikanti et al. 2022, no recomputation; the 5·H·T/d term is the T×T scores, "
            "which fused (sdpa) attention does not store; fp32 log-softmax of the logits",
        ),
        Figure("total", 4 * weights + acts, "bytes", "4·P·b + activations", f"4·{total}·{b} + {acts}"),
    ]
    return report


# ---------------------------------------------------------------- KV cache, by architecture
def _self_cache(c: GPTConfig, T: int, batch: int, dt: str, kv_dt: str, what: str) -> list[Figure]:
    """The self-attention cache: ``2·L·H_kv·d_k·b`` bytes per token, ``2·L·B·H_kv·T·d_k·b`` in all."""
    L, Hkv, dk = c.n_layer, c.n_kv_head, c.head_dim
    assert Hkv is not None
    _, b_kv, scale_bytes = KV_DTYPES[kv_dt]
    per_token = 2 * L * Hkv * (dk * b_kv + scale_bytes)
    bk = "b_kv" if kv_dt != dt else "b"
    if scale_bytes:  # int8: every cached vector also stores its float32 scale
        formula, calc = f"2·L·H_kv·(d_k·{bk} + 4)", f"2·{L}·{Hkv}·({dk}·{b_kv} + 4)"
        full, full_calc = f"2·L·B·H_kv·T·(d_k·{bk} + 4)", f"2·{L}·{batch}·{Hkv}·{T}·({dk}·{b_kv} + 4)"
    else:
        formula, calc = f"2·L·H_kv·d_k·{bk}", f"2·{L}·{Hkv}·{dk}·{b_kv}"
        full, full_calc = f"2·L·B·H_kv·T·d_k·{bk}", f"2·{L}·{batch}·{Hkv}·{T}·{dk}·{b_kv}"
    return [
        Figure("per token", per_token, "bytes", formula, calc, f"K and V of every {what}layer"),
        Figure(
            "cache",
            per_token * batch * T,
            "bytes",
            full,
            full_calc,
            f"what gptlab.model.KVCache allocates ({kv_dt})",
        ),
    ]


def _decoder_cache(c: GPTConfig, T: int, S: int, batch: int, dt: str, kv_dt: str) -> list[Figure]:
    return _self_cache(c, T, batch, dt, kv_dt, "")


def _encoder_cache(c: GPTConfig, T: int, S: int, batch: int, dt: str, kv_dt: str) -> list[Figure]:
    note = "a bidirectional encoder generates nothing: `gptlab fill` runs one forward over the whole text"
    return [
        Figure("per token", 0, "bytes", "0", "", note),
        Figure("cache", 0, "bytes", "0", "", "no KV cache"),
    ]


def _encoder_decoder_cache(c: GPTConfig, T: int, S: int, batch: int, dt: str, kv_dt: str) -> list[Figure]:
    """Self-attention cache per target token, plus each layer's ``K_enc, V_enc``, computed once per source."""
    L, Hkv, dk, b = c.n_layer, c.n_kv_head, c.head_dim, DTYPES[dt][1]
    assert Hkv is not None
    own = _self_cache(c, T, batch, dt, kv_dt, "decoder ")
    cross = 2 * L * batch * Hkv * S * dk * b
    return [
        *own[:1],
        Figure("self-attention cache", own[1].value, "bytes", own[1].formula, own[1].calc, own[1].note),
        Figure(
            "cross K/V (per source)",
            cross,
            "bytes",
            "2·L·B·H_kv·S·d_k·b",
            f"2·{L}·{batch}·{Hkv}·{S}·{dk}·{b}",
            "K_enc, V_enc of every decoder layer, computed once per source and read at every step",
        ),
        Figure("cache", own[1].value + cross, "bytes", "self-attention cache + cross K/V", ""),
    ]


#: config.arch → the "KV cache (generation)" section
KV_CACHES = {
    "decoder": _decoder_cache,
    "encoder": _encoder_cache,
    "encoder-decoder": _encoder_decoder_cache,
}


def load_config(
    preset: str | None = None, config_file: str | None = None, model: str | None = None
) -> tuple[GPTConfig, str]:
    """The configuration to size, from exactly one of a preset name, a JSON file, or a model: a
    checkpoint or run directory, a Hugging Face folder, a GGUF file or ``smollm2``
    (``gptlab.sources.source_config``: its config only, no weights read).

    A JSON file holds either the ``GPTConfig`` fields or a checkpoint's ``config.json``.
    Returns ``(config, name)``.
    """
    given = [s for s in (preset, config_file, model) if s is not None]
    if len(given) != 1:
        raise GptlabError(
            "give exactly one of --preset NAME, --config FILE or a model "
            f"(presets: {', '.join(GPTConfig.preset_names())})"
        )
    if preset is not None:
        return GPTConfig.preset(preset), preset
    from gptlab import checkpoint as ckpt

    if config_file is not None:
        path = Path(config_file)
        if path.is_dir():
            raise GptlabError(
                f"{path}: --config takes a JSON file; a checkpoint directory goes without --config"
            )
        data = ckpt.read_json(path)
        if isinstance(data, dict) and "gptlab_format" in data:
            return ckpt.read_config(path), path.name
        try:
            return GPTConfig.from_dict(data), path.name
        except GptlabError as exc:
            raise GptlabError(f"{path}: {exc}") from None
    assert model is not None
    from gptlab.sources import source_config

    return source_config(model), str(model)


def meta_model(config: GPTConfig) -> GPT:
    """``GPT(config)`` on the ``meta`` device: shapes only, no memory, built in milliseconds."""
    from gptlab.model import GPT, skip_init

    with skip_init(), torch.device("meta"):
        return GPT(config)


def count_parameters(config: GPTConfig) -> dict[str, int]:
    """``GPT(config).num_params()`` without allocating weights (see ``meta_model``)."""
    return meta_model(config).num_params()


__all__ = [
    "DTYPES",
    "Figure",
    "SizeReport",
    "count_parameters",
    "dtype_name",
    "load_config",
    "meta_model",
    "size_report",
]
