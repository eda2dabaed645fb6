"""``GPTConfig``: every shape and option of the model in one dataclass.

Options are chosen by name (``pos="rope"``, ``norm="rmsnorm"``, ``mlp="swiglu"``);
each name maps to a small module in this package. ``__post_init__`` validates
the combination and says what to change. ``to_dict``/``from_dict`` round-trip
through JSON, and ``GPTConfig.preset(name)`` builds the named shapes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from gptlab import configs
from gptlab.errors import GptlabError

GATED_MLPS = ("swiglu", "geglu", "reglu", "dual_glu")  # three matrices: (act(x·W_1) ⊙ x·W_3)·W_2, or σ ⊙ σ
# The names an option accepts are the keys of the registry that builds it. The registries' modules
# import this one, so they are read when a config is validated (by then ``gptlab.model`` is loaded).
REGISTRIES = {
    "pos": ("gptlab.model.positional", "POSITIONAL"),
    "norm": ("gptlab.model.norms", "NORMS"),
    "norm_placement": ("gptlab.model.block", "RESIDUALS"),
    "mlp": ("gptlab.model.mlp", "MLPS"),
    "glu_act": ("gptlab.model.mlp", "GATE_ACTIVATIONS"),  # σ of mlp="dual_glu"
    "arch": ("gptlab.model", "MODELS"),  # decoder, encoder, encoder-decoder
}
_OPTION_TUPLES = {
    "POS_OPTIONS": "pos",
    "NORM_OPTIONS": "norm",
    "PLACEMENT_OPTIONS": "norm_placement",
    "MLP_OPTIONS": "mlp",
    "GLU_ACT_OPTIONS": "glu_act",
    "ARCH_OPTIONS": "arch",
}


def option_names(field_name: str) -> tuple[str, ...]:
    """The values ``GPTConfig.<field_name>`` accepts: ``option_names("norm")`` → ``("layernorm", "rmsnorm")``."""
    module, registry = REGISTRIES[field_name]
    return tuple(getattr(importlib.import_module(module), registry))


def __getattr__(name: str) -> tuple[str, ...]:  # POS_OPTIONS, NORM_OPTIONS, ...: the registries' keys
    if name in _OPTION_TUPLES:
        return option_names(_OPTION_TUPLES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _default_d_ff(n_embd: int, mlp: str) -> int:
    """Hidden width of the feed-forward network.

    Ungated: ``4·d_model`` (the blueprint's ratio). Gated networks (SwiGLU, GEGLU,
    ReGLU, the blueprint's σ ⊙ σ) have three matrices, so they use ``2/3·4·d_model =
    8/3·d_model`` rounded up to a multiple of 64 to keep the parameter count close
    to ``8·d_model²``.
    """
    if mlp in GATED_MLPS:
        return 64 * math.ceil(8 * n_embd / 3 / 64)
    return 4 * n_embd


@dataclass
class GPTConfig:
    """Shapes and options of a transformer: decoder-only (GPT), encoder-only (BERT) or encoder–decoder.

    The names follow GPT-2 / nanoGPT: ``n_embd`` is the blueprint's ``d_model``,
    ``block_size`` the context length ``T_max``, ``d_k = n_embd / n_head``.
    """

    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None  # None: same as n_head (MHA). 1: MQA. A divisor: GQA.
    n_embd: int = 768
    d_ff: int | None = None  # None: 4·n_embd (8/3·n_embd for the gated networks)
    pos: str = "learned"
    rope_theta: float = 10000.0
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_placement: str = "pre"
    mlp: str = "gelu"
    glu_act: str = "sigmoid"  # σ of mlp="dual_glu": σ(x·W_1 + b_1) ⊙ σ(x·W_3 + b_3), then W_2
    bias: bool = True
    dropout: float = 0.0
    tie_embeddings: bool = True
    qk_norm: bool = False
    logit_softcap: float | None = None
    n_experts: int = 0  # 0: a dense feed-forward network. >1: a mixture of experts.
    experts_top_k: int = 2
    moe_aux_weight: float = 0.01
    init_std: float = 0.02
    zero_init_residual: bool = False  # zero the residual output projections (a modern recipe)
    vocab_multiple: int = 1  # pad embedding and head rows internally to a multiple of this (64 on GPUs)
    arch: str = "decoder"  # decoder (GPT) | encoder (bidirectional, BERT) | encoder-decoder (T5)
    causal: bool | None = None  # None: False for arch="encoder", else True (the mask M)
    n_encoder_layer: int | None = None  # encoder-decoder: encoder blocks (None: n_layer); else 0
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # free-form notes (e.g. the source of imported weights)

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.d_ff is None:
            self.d_ff = _default_d_ff(self.n_embd, self.mlp)
        if self.causal is None:
            self.causal = self.arch != "encoder"
        if self.n_encoder_layer is None:
            self.n_encoder_layer = self.n_layer if self.arch == "encoder-decoder" else 0
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ``GptlabError`` naming the field to change if the options do not fit."""

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise GptlabError(f"invalid model config: {msg}")

        for name in (
            "vocab_size",
            "block_size",
            "n_layer",
            "n_head",
            "n_embd",
            "d_ff",
            "n_kv_head",
            "vocab_multiple",
        ):
            value = getattr(self, name)
            need(
                isinstance(value, int) and not isinstance(value, bool) and value > 0,
                f"{name} must be a positive integer, got {value!r}",
            )
        for option in REGISTRIES:
            names, value = option_names(option), getattr(self, option)
            need(value in names, f"{option} must be one of {', '.join(names)}; got {value!r}")
        need(isinstance(self.causal, bool), f"causal must be true, false or null, got {self.causal!r}")
        need(
            not (self.arch == "encoder" and self.causal),
            "arch='encoder' is bidirectional; drop causal=true (or use arch='decoder')",
        )
        need(
            not (self.arch == "encoder-decoder" and not self.causal),
            "the decoder of arch='encoder-decoder' stays causal; drop causal=false",
        )
        need(
            isinstance(self.n_encoder_layer, int)
            and self.n_encoder_layer >= 0
            and (self.n_encoder_layer > 0) == (self.arch == "encoder-decoder"),
            f"n_encoder_layer must be ≥ 1 for arch='encoder-decoder' and 0 otherwise, got {self.n_encoder_layer!r}",
        )
        need(
            self.n_embd % self.n_head == 0,
            f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
            f"change n_embd to a multiple of {self.n_head} or pick another n_head",
        )
        assert self.n_kv_head is not None
        need(
            self.n_kv_head <= self.n_head and self.n_head % self.n_kv_head == 0,
            f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head}); "
            f"use n_kv_head = n_head (MHA), a divisor of n_head (GQA) or 1 (MQA)",
        )
        if self.pos == "rope":
            need(
                self.head_dim % 2 == 0,
                f"pos='rope' needs an even head size, but n_embd/n_head = {self.head_dim}",
            )
            need(self.rope_theta > 0, f"rope_theta must be positive, got {self.rope_theta}")
        if self.pos == "sinusoidal":
            need(self.n_embd % 2 == 0, f"pos='sinusoidal' needs an even n_embd, got {self.n_embd}")
        need(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}")
        need(self.norm_eps > 0, f"norm_eps must be positive, got {self.norm_eps}")
        need(self.init_std > 0, f"init_std must be positive, got {self.init_std}")
        need(
            self.logit_softcap is None or self.logit_softcap > 0,
            f"logit_softcap must be positive or null, got {self.logit_softcap}",
        )
        need(
            self.n_experts >= 0 and self.n_experts != 1,
            f"n_experts must be 0 (dense) or at least 2, got {self.n_experts}",
        )
        if self.n_experts:
            need(
                1 <= self.experts_top_k <= self.n_experts,
                f"experts_top_k must be between 1 and n_experts ({self.n_experts}), got {self.experts_top_k}",
            )

    # ------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        """``d_k = d_model / n_head``."""
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and the head: ``vocab_size`` rounded up to ``vocab_multiple``.

        The extra rows are never a token: their logits are sliced off (and masked out of the
        loss), checkpoints and exports hold ``vocab_size`` rows. 50,257 → 50,304 lets GPU matrix
        products use their fastest tiles.
        """
        return self.vocab_multiple * math.ceil(self.vocab_size / self.vocab_multiple)

    @property
    def n_rep(self) -> int:
        """How many query heads share one key/value head (1 for MHA)."""
        assert self.n_kv_head is not None
        return self.n_head // self.n_kv_head

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        return configs.from_dict(cls, data, "model config")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GPTConfig:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise GptlabError(f"model config is not valid JSON: {exc}") from None

    def replace(self, **changes: Any) -> GPTConfig:
        """A copy with some fields changed (and re-validated)."""
        data = self.to_dict()
        if "mlp" in changes or "n_embd" in changes:
            data["d_ff"] = None  # re-derive unless given
        if "arch" in changes:
            data["causal"] = data["n_encoder_layer"] = None
        data.update(changes)
        return GPTConfig.from_dict(data)

    # ---------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A named configuration, e.g. ``GPTConfig.preset("gpt2")``; overrides change fields."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise GptlabError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
        data = dict(base)
        data.update(overrides)
        return cls.from_dict(data)

    @staticmethod
    def preset_names() -> list[str]:
        return list(PRESETS)


_GPT2 = dict(
    vocab_size=50257,
    block_size=1024,
    pos="learned",
    norm="layernorm",
    norm_placement="pre",
    mlp="gelu_tanh",
    bias=True,
    tie_embeddings=True,
    dropout=0.0,
)

PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": dict(_GPT2, n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(_GPT2, n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(_GPT2, n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(_GPT2, n_layer=48, n_head=25, n_embd=1600),
    "llama-tiny": dict(
        vocab_size=32000,
        block_size=512,
        n_layer=4,
        n_head=8,
        n_kv_head=2,
        n_embd=256,
        pos="rope",
        rope_theta=10000.0,
        norm="rmsnorm",
        norm_eps=1e-5,
        norm_placement="pre",
        mlp="swiglu",
        bias=False,
        tie_embeddings=False,
    ),
    # the reference character-level shapes (nanoGPT's shakespeare-char, scaled down); the best
    # character-level *recipe* built on it is `gptlab train --config char-best`
    "char-tiny": dict(
        vocab_size=65,
        block_size=64,
        n_layer=4,
        n_head=4,
        n_embd=128,
        pos="learned",
        norm="layernorm",
        mlp="gelu",
        bias=True,
        dropout=0.0,
    ),
}
