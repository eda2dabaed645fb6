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

Compute per token (Kaplan et al. 2020): forward ``2·N + 2·L·T·d`` FLOPs, where ``N``
counts the weights a token multiplies; training ≈ 3× forward (backward ≈ 2× forward).
KV cache: ``2·L·B·H_kv·T·d_k·b`` bytes (blueprint "Stage 5: KV Cache Operations").
Training memory with AdamW: weights + gradients + two moments + activations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode

from gptlab.errors import GptlabError
from gptlab.model.config import GATED_MLPS, GPTConfig
from gptlab.model.mlp import ffn_param_count

if TYPE_CHECKING:
    from gptlab.model import GPT

# dtype name -> (torch dtype, bytes per number)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "fp32": (torch.float32, 4),
    "fp16": (torch.float16, 2),
    "bf16": (torch.bfloat16, 2),
}
# KV-cache storage -> (torch dtype, bytes per number, bytes of scale per cached vector)
KV_DTYPES: dict[str, tuple[torch.dtype, int, int]] = {
    **{name: (dt, b, 0) for name, (dt, b) in DTYPES.items()},
    "int8": (torch.int8, 1, 4),  # k ≈ s·q: int8 numbers and one float32 scale per (row, head, position)
}
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}

# bytes of activations each layer stores per token, per (16-bit) number (Korthikanti et al. 2022):
#   s·b·h·(34 + 5·a·s/h) bytes at 16 bits, i.e. (34 + 5·H·T/d)/2 numbers per token and d.
_ACT_LINEAR = 34
_ACT_SCORES = 5


def dtype_name(name: str, table: dict[str, Any] = DTYPES, what: str = "dtype") -> str:
    """Canonical dtype name (``fp32``, ``fp16``, ``bf16``); aliases such as ``bfloat16`` accepted."""
    key = DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in table:
        raise GptlabError(f"unknown {what} {name!r}; choose one of {', '.join(table)}")
    return key


@dataclass
class Figure:
    """One number, the formula it comes from, and the formula with the numbers put in."""

    name: str
    value: int | float
    unit: str  # "params", "FLOPs", "bytes"
    formula: str
    calc: str = ""
    note: str = ""


@dataclass
class SizeReport:
    """Parameters, FLOPs, KV cache and training memory of one configuration."""

    config: dict[str, Any]
    symbols: dict[str, int | str]
    parameters: list[Figure] = field(default_factory=list)
    compute: list[Figure] = field(default_factory=list)
    kv_cache: list[Figure] = field(default_factory=list)
    training_memory: list[Figure] = field(default_factory=list)
    title: str = ""

    def figure(self, name: str) -> Figure:
        for section in (self.parameters, self.compute, self.kv_cache, self.training_memory):
            for fig in section:
                if fig.name == name:
                    return fig
        raise KeyError(name)

    def value(self, name: str) -> int | float:
        return self.figure(name).value

    def to_dict(self) -> dict[str, Any]:
        sections = ("parameters", "compute", "kv_cache", "training_memory")
        return {
            "title": self.title,
            "config": self.config,
            "symbols": self.symbols,
            **{s: [asdict(f) for f in getattr(self, s)] for s in sections},
        }

    def render(self) -> str:
        lines = [self.title, "  " + "  ".join(f"{k}={v}" for k, v in self.symbols.items()), ""]
        headings = (
            ("Parameters", self.parameters),
            ("Compute per token", self.compute),
            ("KV cache (generation)", self.kv_cache),
            ("Training memory (AdamW)", self.training_memory),
        )
        for heading, figs in headings:
            lines.append(heading)
            for f in figs:
                calc = f" = {f.calc}" if f.calc else ""
                lines.append(f"  {f.name:<24}{_human(f.value, f.unit):>15}   {f.formula}{calc}")
                if f.note:
                    lines.append(f"  {'':<24}{'':>15}     {f.note}")
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"


def _human(value: float, unit: str) -> str:
    """``124,439,808`` params, ``1.2 GFLOPs``, ``474.7 MiB``."""
    if unit == "params":
        return f"{int(value):,}"
    if unit == "bytes":
        for scale, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if value >= scale:
                return f"{value / scale:.1f} {suffix}"
        return f"{int(value)} B"
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.2f} {suffix}{unit}"
    return f"{value:g} {unit}"


# ------------------------------------------------------------------ parameters
def _attention_layer(c: GPTConfig) -> tuple[int, str, str]:
    """One layer's W_Q, W_K, W_V, W_O (+ biases): ``(2 + 2·H_kv/H)·d²``."""
    d, h, hkv, dk = c.n_embd, c.n_head, c.n_kv_head, c.head_dim
    assert hkv is not None
    mats = d * (h + 2 * hkv) * dk + h * dk * d
    biases = ((h + 2 * hkv) * dk + d) if c.bias else 0
    if hkv == h:
        formula, calc = "4·d²", f"4·{d}²"
    else:
        formula, calc = "(2 + 2·H_kv/H)·d²", f"(2 + 2·{hkv}/{h})·{d}²"
    if c.bias:
        formula += " + (d + 2·H_kv·d_k) + d" if hkv != h else " + 4·d"
        calc += f" + ({d} + 2·{hkv}·{dk}) + {d}" if hkv != h else f" + 4·{d}"
    return mats + biases, formula, calc


def _ffn_layer(c: GPTConfig) -> tuple[int, int, str, str]:
    """One layer's feed-forward: ``(total, active per token, formula, calc)``."""
    assert c.d_ff is not None
    d, ff = c.n_embd, c.d_ff
    gated = c.mlp in GATED_MLPS
    one = ffn_param_count(d, ff, gated, c.bias)
    if gated:
        formula, calc = "3·d·d_ff", f"3·{d}·{ff}"
        if c.bias:
            formula, calc = formula + " + 2·d_ff + d", calc + f" + 2·{ff} + {d}"
    elif ff == 4 * d:
        formula, calc = "8·d²", f"8·{d}²"
        if c.bias:
            formula, calc = formula + " + 5·d", calc + f" + 5·{d}"
    else:
        formula, calc = "2·d·d_ff", f"2·{d}·{ff}"
        if c.bias:
            formula, calc = formula + " + d_ff + d", calc + f" + {ff} + {d}"
    if c.n_experts:
        e, k = c.n_experts, c.experts_top_k
        return (e * one + d * e, k * one + d * e, f"E·({formula}) + d·E", f"{e}·({calc}) + {d}·{e}")
    return one, one, formula, calc


def _norm_size(c: GPTConfig) -> tuple[int, str]:
    """γ (and β for a LayerNorm with bias) of one norm over d_model."""
    if c.norm == "layernorm" and c.bias:
        return 2 * c.n_embd, "2·d"
    return c.n_embd, "d"


def _parameters(c: GPTConfig) -> tuple[list[Figure], dict[str, int]]:
    V, d, L, T_max = c.vocab_size, c.n_embd, c.n_layer, c.block_size
    # an encoder–decoder adds L_enc encoder blocks, L cross-attention sublayers (each the size of a
    # self-attention: W_Q, W_K, W_V, W_O) with their norms, a second position table and a final norm
    E = c.n_encoder_layer or 0
    X = L if E else 0
    stacks = "(L + L_enc + L_cross)·" if E else "L·"
    n_att, n_ffn = L + E + X, L + E
    figs: list[Figure] = []
    emb = V * d
    figs.append(
        Figure(
            "embeddings",
            emb,
            "params",
            "V·d",
            f"{V}·{d}",
            "W_e, shared with the output head (eq. 9)" if c.tie_embeddings else "W_e",
        )
    )
    pos = (2 if E else 1) * T_max * d if c.pos == "learned" else 0
    pos_notes = {
        "learned": ("2·T_max·d", f"2·{T_max}·{d}", "W_p of encoder and decoder")
        if E
        else ("T_max·d", f"{T_max}·{d}", "the learned table W_p"),
        "sinusoidal": ("0", "", "a fixed sin/cos table: a buffer, not a parameter"),
        "rope": ("0", "", "rotary angles are computed, not learned"),
        "alibi": ("0", "", "ALiBi slopes are fixed"),
        "none": ("0", "", "no position encoding"),
    }
    formula, calc, note = pos_notes[c.pos]
    figs.append(Figure("positions", pos, "params", formula, calc, note))

    att, a_formula, a_calc = _attention_layer(c)
    figs.append(
        Figure(
            "attention",
            n_att * att,
            "params",
            f"{stacks}({a_formula})",
            f"{n_att}·({a_calc})",
            f"{att:,} per layer" + (", cross-attention included" if E else ""),
        )
    )
    ffn, ffn_active, f_formula, f_calc = _ffn_layer(c)
    figs.append(
        Figure(
            "feed_forward",
            n_ffn * ffn,
            "params",
            f"{'(L + L_enc)' if E else 'L'}·({f_formula})",
            f"{n_ffn}·({f_calc})",
            f"{ffn:,} per layer"
            + (f"; {ffn_active:,} active per token (k={c.experts_top_k})" if c.n_experts else ""),
        )
    )

    one_norm, n_formula = _norm_size(c)
    n_final = 1 if c.norm_placement == "pre" else 0
    qk = 2 * c.head_dim if c.qk_norm else 0
    n_norms = 2 * L + n_final + (2 * E + X + n_final if E else 0)
    norms = n_norms * one_norm + n_att * qk
    if E:
        formula = f"(3·L + 2·L_enc{' + 2' if n_final else ''})·{n_formula}"
    else:
        formula = f"(2·L{' + 1' if n_final else ''})·{n_formula}"
    calc = (
        f"{n_norms}·{n_formula.replace('d', str(c.n_embd))}"
        if E
        else (f"(2·{L}{' + 1' if n_final else ''})·{n_formula.replace('d', str(c.n_embd))}")
    )
    if qk:
        formula, calc = formula + f" + {stacks}2·d_k", calc + f" + {n_att}·2·{c.head_dim}"
    figs.append(
        Figure(
            "norms",
            norms,
            "params",
            formula,
            calc,
            ("three per decoder block, two per encoder block" if E else "two per block")
            + ((", a final one per stack" if E else ", one final") if n_final else "")
            + (", QK-norm" if qk else ""),
        )
    )

    head = 0 if c.tie_embeddings else V * d
    figs.append(
        Figure(
            "head",
            head,
            "params",
            "0 (tied)" if c.tie_embeddings else "V·d",
            "" if c.tie_embeddings else f"{V}·{d}",
            "logits = h·W_eᵀ reuse W_e" if c.tie_embeddings else "a separate W_out",
        )
    )
    total = emb + pos + n_att * att + n_ffn * ffn + norms + head
    figs.append(Figure("total", total, "params", "sum of the above"))
    figs.append(Figure("total_without_positions", total - pos, "params", "total − positions"))
    active = emb + n_att * att + n_ffn * ffn_active + norms + head
    if c.n_experts:
        figs.append(
            Figure(
                "active_per_token",
                active,
                "params",
                "total − positions − L·(E − k)·FFN",
                note="weights one token uses",
            )
        )
    # weights a token multiplies: blocks (active experts), norms, and the head V·d (even when tied);
    # the embedding lookup and the position table cost no multiply-adds
    matmul = n_att * att + n_ffn * ffn_active + norms + V * d
    return figs, {"total": total, "matmul": matmul, "positions": pos}


# ---------------------------------------------------------------- everything
def size_report(
    config: GPTConfig,
    context: int | None = None,
    batch: int = 1,
    dtype: str = "fp32",
    name: str = "",
    kv_dtype: str | None = None,
) -> SizeReport:
    """Parameters, FLOPs per token, KV-cache bytes and AdamW training memory of ``config``.

    ``context`` (default ``block_size``) is the number of tokens ``T`` the costs are for,
    ``batch`` the batch size ``B``, ``dtype`` the number format (``fp32``, ``fp16``, ``bf16``),
    ``kv_dtype`` the KV-cache storage (default ``dtype``; also ``int8``, with a float32 scale per vector).
    """
    if not isinstance(config, GPTConfig):
        raise GptlabError(f"size_report needs a GPTConfig, got {type(config).__name__}")
    T = config.block_size if context is None else context
    if not isinstance(T, int) or T <= 0:
        raise GptlabError(f"context must be a positive number of tokens, got {context!r}")
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
    symbols.update(T=T, B=batch, b=f"{b} ({dt})")
    if kv_dt != dt:
        symbols["b_kv"] = f"{b_kv} ({kv_dt})"
    kv_kind = "MHA" if Hkv == H else ("MQA" if Hkv == 1 else "GQA")
    title = (
        f"{name + ': ' if name else ''}{L} layers, d_model={d}, {H} heads ({Hkv} KV heads, {kv_kind}), "
        f"d_ff={c.d_ff} {c.mlp}{f' ×{c.n_experts} experts' if c.n_experts else ''}, "
        f"pos={c.pos}, vocab {V}, context {c.block_size}"
    )
    report = SizeReport(config=c.to_dict(), symbols=symbols, title=title)
    report.parameters, counts = _parameters(c)
    N, total = counts["matmul"], counts["total"]

    fwd = 2 * N + 2 * L * T * d
    report.compute = [
        Figure(
            "N (multiplied weights)",
            N,
            "params",
            "blocks + norms + V·d (head)",
            note="the embedding lookup and position table cost no FLOPs; MoE counts k experts",
        ),
        Figure(
            "forward",
            fwd,
            "FLOPs",
            "2·N + 2·L·T·d",
            f"2·{N} + 2·{L}·{T}·{d}",
            "per token at context T; 2·L·T·d is Q·Kᵀ and A·V averaged over causal positions",
        ),
        Figure("training", 3 * fwd, "FLOPs", "3·forward", f"3·{fwd}", "backward ≈ 2× forward"),
        Figure(
            "training step",
            3 * fwd * batch * T,
            "FLOPs",
            "3·forward·B·T",
            f"3·{fwd}·{batch}·{T}",
            "one optimizer step over B sequences of T tokens",
        ),
    ]

    per_token = 2 * L * Hkv * (dk * b_kv + scale_bytes)
    bk = "b_kv" if kv_dt != dt else "b"
    if scale_bytes:  # int8: every cached vector also stores its float32 scale
        formula, calc = f"2·L·H_kv·(d_k·{bk} + 4)", f"2·{L}·{Hkv}·({dk}·{b_kv} + 4)"
        full, full_calc = f"2·L·B·H_kv·T·(d_k·{bk} + 4)", f"2·{L}·{batch}·{Hkv}·{T}·({dk}·{b_kv} + 4)"
    else:
        formula, calc = f"2·L·H_kv·d_k·{bk}", f"2·{L}·{Hkv}·{dk}·{b_kv}"
        full, full_calc = f"2·L·B·H_kv·T·d_k·{bk}", f"2·{L}·{batch}·{Hkv}·{T}·{dk}·{b_kv}"
    report.kv_cache = [
        Figure("per token", per_token, "bytes", formula, calc, "K and V of every layer"),
        Figure(
            "cache",
            per_token * batch * T,
            "bytes",
            full,
            full_calc,
            f"what gptlab.model.KVCache allocates ({kv_dt})",
        ),
    ]

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
            "L·B·T·d·(34 + 5·H·T/d)·b/2 + B·T·V·(b + 4)",
            f"{L}·{batch}·{T}·{d}·(34 + 5·{H}·{T}/{d})·{b}/2 + {batch}·{T}·{V}·({b} + 4)",
            "Korthikanti et al. 2022, no recomputation; the 5·H·T/d term is the T×T scores, "
            "which fused (sdpa) attention does not store; fp32 log-softmax of the logits",
        ),
        Figure("total", 4 * weights + acts, "bytes", "4·P·b + activations", f"4·{total}·{b} + {acts}"),
    ]
    return report


def load_config(
    preset: str | None = None, config_file: str | None = None, checkpoint: str | None = None
) -> tuple[GPTConfig, str]:
    """The configuration to size, from exactly one of a preset name, a JSON file, or a checkpoint.

    A JSON file holds either the ``GPTConfig`` fields or a checkpoint's ``config.json``.
    Returns ``(config, name)``.
    """
    given = [s for s in (preset, config_file, checkpoint) if s is not None]
    if len(given) != 1:
        raise GptlabError(
            "give exactly one of --preset NAME, --config FILE or a checkpoint directory "
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
    assert checkpoint is not None
    directory = ckpt.resolve_checkpoint(checkpoint)
    return ckpt.read_config(directory / ckpt.CONFIG_FILE), str(checkpoint)


class _WeightsOnMeta(TorchFunctionMode):
    """Allocate ``torch.empty`` (how ``nn.Linear``/``nn.Embedding`` make weights) on the meta device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = dict(kwargs or {})
        if func is torch.empty:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def meta_model(config: GPTConfig) -> GPT:
    """``GPT(config)`` whose weight matrices live on the ``meta`` device: shapes only, built in milliseconds.

    Small tensors (norm weights, position tables) stay on the CPU, so no meta kernel is
    missing; random ``normal_`` initialisation is skipped (it would fill tensors that hold no data).
    """
    from gptlab.model import GPT

    with _WeightsOnMeta(), mock.patch("torch.nn.init.normal_", lambda tensor, *args, **kwargs: tensor):
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
