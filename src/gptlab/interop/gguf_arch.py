"""Which llama.cpp architecture computes a gptlab decoder's function, and its GGUF tensor names.

Each entry of ``EXPORTS`` is a llama.cpp ``general.architecture`` whose forward pass equals gptlab's
for the options it requires (``requires``: option → (met?, what it needs)); ``to_gguf`` takes the
first entry a model meets, and refuses a model none meets, naming the nearest entry's needs.

    llama    RoPE (adjacent pairs) + pre-RMSNorm + SwiGLU + GQA          W_Q, W_K rows permuted
    qwen3    llama + per-head RMSNorm of q and k before RoPE (rotate-half RoPE, no permutation)
    arcee    llama with an ungated ReLU² FFN: W_2·max(0, W_1·x)²          W_Q, W_K rows permuted
    apertus  qwen3's attention + an ungated xIELU FFN; xIELU with α_p = 1, α_n = β = 0 is ReLU²
    gpt2     learned positions + pre-LayerNorm + GELU-tanh FFN, biases (zeros where gptlab has none)

gptlab rotates feature ``j`` with ``j + d_k/2`` (rotate-half, llama.cpp's NEOX RoPE), so for the
architectures llama.cpp runs with adjacent-pair RoPE (llama, arcee) the q/k rows are permuted as
llama.cpp's own converter does (``gguf.permute_rope``, the inverse of the import's).

xIELU (llama.cpp ``ggml_xielu``): ``x > 0: α_p·x² + β·x``, else ``α_n·(expm1(min(x, ε)) − x) + β·x``,
with ``α_p = softplus(a_p)`` and ``α_n = β + softplus(a_n)`` computed in float32 when the graph is
built. ``a_p = XIELU_ONE`` makes ``α_p`` exactly 1.0 (glibc's ``expf``/``logf``), ``a_n = −1000``
makes ``softplus`` underflow to exactly 0, and ``β = 0``: the activation is ``max(0, x)²``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gptlab.errors import GptlabError
from gptlab.interop.gguf import permute_rope
from gptlab.model import GPTConfig

Convert = Callable[[np.ndarray, GPTConfig], list[np.ndarray]]
Requirement = tuple[Callable[[GPTConfig], bool], str]

#: ``softplus(XIELU_ONE) == 1.0`` in float32 (``logf(1 + expf(a))``); ``softplus(-1000) == 0``.
XIELU_ONE = 0.5413249731063843
XIELU_ZERO = -1000.0


def _same(t: np.ndarray, cfg: GPTConfig) -> list[np.ndarray]:
    return [t]


def _split_qkv(t: np.ndarray, cfg: GPTConfig, permute: bool) -> list[np.ndarray]:
    """Fused ``[W_Q | W_K | W_V]`` rows → three tensors; q and k rows in llama.cpp's RoPE order if asked."""
    assert cfg.n_kv_head is not None
    q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
    q, k, v = t[:q_dim], t[q_dim : q_dim + kv_dim], t[q_dim + kv_dim :]
    if permute:
        q, k = permute_rope(q, cfg.n_head), permute_rope(k, cfg.n_kv_head)
    return [q, k, v]


def _qkv_permuted(t: np.ndarray, cfg: GPTConfig) -> list[np.ndarray]:
    return _split_qkv(t, cfg, permute=True)


def _qkv_plain(t: np.ndarray, cfg: GPTConfig) -> list[np.ndarray]:
    return _split_qkv(t, cfg, permute=False)


@dataclass(frozen=True)
class ExportArch:
    """One llama.cpp architecture: what it requires of a ``GPTConfig`` and how tensors are named.

    ``tensors``: (gptlab name with ``{i}`` for the layer, GGUF names, conversion) — one gptlab tensor
    may become several (the fused qkv matrix). ``zero_bias``: GGUF bias names llama.cpp requires that
    a model without biases fills with zeros (the same function). ``untied_head``: llama.cpp needs
    ``output.weight`` even when the head shares the token table. ``xielu``: write the ReLU² xIELU keys.
    """

    name: str
    requires: dict[str, Requirement]
    tensors: tuple[tuple[str, tuple[str, ...], Convert], ...]
    rope: bool = True
    zero_bias: tuple[tuple[str, str], ...] = ()  # (GGUF bias name, the weight whose rows it matches)
    untied_head: bool = False
    xielu: bool = False

    def problems(self, cfg: GPTConfig) -> list[str]:
        """The options of ``cfg`` this architecture cannot compute, as ``"needs (not value)"``."""
        return [
            f"{needs} (not {getattr(cfg, name)!r})"
            for name, (ok, needs) in self.requires.items()
            if not ok(cfg)
        ]


def _is(option: str, value: object) -> Requirement:
    return (lambda c: getattr(c, option) == value, f"{option}={value!r}")


#: What every exported architecture requires: a causal pre-norm decoder without experts or soft-capping.
COMMON: dict[str, Requirement] = {
    "arch": _is("arch", "decoder"),
    "causal": _is("causal", True),
    "norm_placement": _is("norm_placement", "pre"),
    "logit_softcap": _is("logit_softcap", None),
    "n_experts": _is("n_experts", 0),
}
ROPE: dict[str, Requirement] = {
    **COMMON,
    "pos": _is("pos", "rope"),
    "norm": _is("norm", "rmsnorm"),
    "bias": _is("bias", False),
}

_B = "blk.{i}."
_EMBED = (("wte.weight", ("token_embd.weight",), _same), ("norm_f.weight", ("output_norm.weight",), _same))
_HEAD = (("lm_head.weight", ("output.weight",), _same),)
_NORMS = (
    ("blocks.{i}.norm1.weight", (_B + "attn_norm.weight",), _same),
    ("blocks.{i}.norm2.weight", (_B + "ffn_norm.weight",), _same),
    ("blocks.{i}.attn.proj.weight", (_B + "attn_output.weight",), _same),
)
_QKV_NAMES = (_B + "attn_q.weight", _B + "attn_k.weight", _B + "attn_v.weight")
_QK_NORM = (
    ("blocks.{i}.attn.q_norm.weight", (_B + "attn_q_norm.weight",), _same),
    ("blocks.{i}.attn.k_norm.weight", (_B + "attn_k_norm.weight",), _same),
)
_SWIGLU = (
    ("blocks.{i}.mlp.gate.weight", (_B + "ffn_gate.weight",), _same),
    ("blocks.{i}.mlp.up.weight", (_B + "ffn_up.weight",), _same),
    ("blocks.{i}.mlp.proj.weight", (_B + "ffn_down.weight",), _same),
)
_UNGATED = (
    ("blocks.{i}.mlp.fc.weight", (_B + "ffn_up.weight",), _same),
    ("blocks.{i}.mlp.proj.weight", (_B + "ffn_down.weight",), _same),
)

EXPORTS: dict[str, ExportArch] = {
    "llama": ExportArch(
        "llama",
        {**ROPE, "mlp": _is("mlp", "swiglu"), "qk_norm": _is("qk_norm", False)},
        (*_EMBED, *_HEAD, *_NORMS, ("blocks.{i}.attn.qkv.weight", _QKV_NAMES, _qkv_permuted), *_SWIGLU),
    ),
    "qwen3": ExportArch(
        "qwen3",
        {**ROPE, "mlp": _is("mlp", "swiglu"), "qk_norm": _is("qk_norm", True)},
        (
            *_EMBED,
            *_HEAD,
            *_NORMS,
            ("blocks.{i}.attn.qkv.weight", _QKV_NAMES, _qkv_plain),
            *_QK_NORM,
            *_SWIGLU,
        ),
    ),
    "arcee": ExportArch(
        "arcee",
        {**ROPE, "mlp": _is("mlp", "relu2"), "qk_norm": _is("qk_norm", False)},
        (*_EMBED, *_HEAD, *_NORMS, ("blocks.{i}.attn.qkv.weight", _QKV_NAMES, _qkv_permuted), *_UNGATED),
    ),
    "apertus": ExportArch(
        "apertus",
        {**ROPE, "mlp": _is("mlp", "relu2"), "qk_norm": _is("qk_norm", True)},
        (
            *_EMBED,
            *_HEAD,
            *_NORMS,
            ("blocks.{i}.attn.qkv.weight", _QKV_NAMES, _qkv_plain),
            *_QK_NORM,
            *_UNGATED,
        ),
        untied_head=True,
        xielu=True,
    ),
    "gpt2": ExportArch(
        "gpt2",
        {
            **COMMON,
            "pos": _is("pos", "learned"),
            "norm": _is("norm", "layernorm"),
            "mlp": _is("mlp", "gelu_tanh"),
            "qk_norm": _is("qk_norm", False),
            "n_kv_head": (lambda c: c.n_kv_head == c.n_head, "n_kv_head=n_head"),
        },
        (
            *_EMBED,
            *_HEAD,
            ("positional.wpe.weight", ("position_embd.weight",), _same),
            ("norm_f.bias", ("output_norm.bias",), _same),
            ("blocks.{i}.norm1.weight", (_B + "attn_norm.weight",), _same),
            ("blocks.{i}.norm1.bias", (_B + "attn_norm.bias",), _same),
            ("blocks.{i}.norm2.weight", (_B + "ffn_norm.weight",), _same),
            ("blocks.{i}.norm2.bias", (_B + "ffn_norm.bias",), _same),
            ("blocks.{i}.attn.qkv.weight", (_B + "attn_qkv.weight",), _same),
            ("blocks.{i}.attn.qkv.bias", (_B + "attn_qkv.bias",), _same),
            ("blocks.{i}.attn.proj.weight", (_B + "attn_output.weight",), _same),
            ("blocks.{i}.attn.proj.bias", (_B + "attn_output.bias",), _same),
            ("blocks.{i}.mlp.fc.weight", (_B + "ffn_up.weight",), _same),
            ("blocks.{i}.mlp.fc.bias", (_B + "ffn_up.bias",), _same),
            ("blocks.{i}.mlp.proj.weight", (_B + "ffn_down.weight",), _same),
            ("blocks.{i}.mlp.proj.bias", (_B + "ffn_down.bias",), _same),
        ),
        rope=False,
        zero_bias=(
            ("output_norm.bias", "output_norm.weight"),
            (_B + "attn_norm.bias", _B + "attn_norm.weight"),
            (_B + "ffn_norm.bias", _B + "ffn_norm.weight"),
            (_B + "attn_qkv.bias", _B + "attn_qkv.weight"),
            (_B + "attn_output.bias", _B + "attn_output.weight"),
            (_B + "ffn_up.bias", _B + "ffn_up.weight"),
            (_B + "ffn_down.bias", _B + "ffn_down.weight"),
        ),
    ),
}


def choose(cfg: GPTConfig) -> ExportArch:
    """The first architecture of ``EXPORTS`` that computes ``cfg``'s function.

    None does: a ``GptlabError`` naming the options that stop the nearest one (fewest problems).
    """
    problems = {name: arch.problems(cfg) for name, arch in EXPORTS.items()}
    for name, found in problems.items():
        if not found:
            return EXPORTS[name]
    nearest = min(problems, key=lambda name: len(problems[name]))
    raise GptlabError(
        f"this model has no exact llama.cpp architecture: the nearest, {nearest}, needs "
        f"{', '.join(problems[nearest])}"
    )


__all__ = ["EXPORTS", "XIELU_ONE", "XIELU_ZERO", "ExportArch", "choose"]
