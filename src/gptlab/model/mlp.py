"""Position-wise feed-forward networks (blueprint §2.2.2, eq. 6), chosen by name.

    FFN(x) = σ(x·W_1 + b_1)·W_2 + b_2        σ ∈ {ReLU, GELU, GELU-tanh, ReLU²}
    GLU family:  (act(x·W_1) ⊙ x·W_3)·W_2     SwiGLU (act = SiLU), GEGLU (GELU), ReGLU (ReLU)
    dual_glu:    (σ(x·W_1 + b_1) ⊙ σ(x·W_3 + b_3))·W_2 + b_2
                 (document 000's FFNN(x) = σ(W₁x + b₁) × σ(W₂x + b₂), then the output
                 projection; σ = ``config.glu_act``, sigmoid by default)

Every gated network has three matrices, so its default ``d_ff`` is 2/3 of 4·d_model
(``GPTConfig``) and its parameter count is ``3·d·d_ff (+ 2·d_ff + d)``
(``ffn_param_count``, which ``gptlab size`` uses).

``GELU-tanh(x) = ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` (GPT-2's approximation),
``ReLU²(x) = max(0, x)²``. A mixture of experts (``n_experts > 1``) routes each
token to its top-k experts: ``y = Σ_{e ∈ topk} softmax(g)_e · FFN_e(x)`` with
router logits ``g = x·W_g``, and a load-balancing loss ``E · Σ_e f_e·P_e`` (Switch
Transformer), where ``f_e`` is the share of routed tokens and ``P_e`` the mean
router probability of expert ``e``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.model.config import GPTConfig
from gptlab.model.gelu import gelu


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """``½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``."""
    return F.gelu(x, approximate="tanh")


class _ReLU2(torch.autograd.Function):
    """``ReLU²(x) = r²`` with ``r = max(0, x)``; ``dReLU²/dx = 2r`` (0 where x ≤ 0).

    One saved tensor (``r``) and one pass each way. Autograd's own ``F.relu(x).square()`` runs
    the square's backward as a power and its multiplications, then the ReLU's mask: 3–4× the
    time of ``(r + r)·g`` on a CPU, for the same bits (``2r`` is exact).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        r = F.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        r: torch.Tensor = ctx.saved_tensors[0]
        return (r + r).mul_(grad)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """``max(0, x)²``."""
    y: torch.Tensor = _ReLU2.apply(x)  # type: ignore[no-untyped-call]  # torch: Function.apply is untyped
    return y


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "relu2": relu2,
}


class FeedForward(nn.Module):
    """``FFN(x) = σ(x·W_1 + b_1)·W_2 + b_2`` with ``W_1 ∈ R^{d×d_ff}``, ``W_2 ∈ R^{d_ff×d}``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.d_ff is not None
        self.fc = nn.Linear(config.n_embd, config.d_ff, bias=config.bias)  # W_1, b_1
        self.proj = nn.Linear(config.d_ff, config.n_embd, bias=config.bias)  # W_2, b_2
        self.proj.residual_out = True  # type: ignore[assignment]
        self.act = ACTIVATIONS[config.mlp]
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.dropout(self.proj(self.act(self.fc(x))))
        return y


GATE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": F.relu,
    "gelu": gelu,
    "silu": F.silu,
}


class GatedFeedForward(nn.Module):
    """``GLU(x) = (act(x·W_1) ⊙ act_up(x·W_3))·W_2``: ``gate`` is W_1, ``up`` W_3, ``proj`` W_2.

    ``act`` is SiLU (SwiGLU, Llama's), GELU (GEGLU) or ReLU (ReGLU); ``act_up`` is the
    identity, except for ``dual_glu`` where both halves pass through σ.
    """

    #: config.mlp → (act of the gate, act of the up projection or None)
    KINDS: dict[str, tuple[str | None, str | None]] = {
        "swiglu": ("silu", None),
        "geglu": ("gelu", None),
        "reglu": ("relu", None),
        "dual_glu": (None, None),  # both σ = config.glu_act
    }

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.d_ff is not None
        self.gate = nn.Linear(config.n_embd, config.d_ff, bias=config.bias)  # W_1
        self.up = nn.Linear(config.n_embd, config.d_ff, bias=config.bias)  # W_3
        self.proj = nn.Linear(config.d_ff, config.n_embd, bias=config.bias)  # W_2
        self.proj.residual_out = True  # type: ignore[assignment]
        self.dropout = nn.Dropout(config.dropout)
        gate, up = self.KINDS[config.mlp]
        self.act = GATE_ACTIVATIONS[gate or config.glu_act]
        self.act_up = GATE_ACTIVATIONS[config.glu_act] if config.mlp == "dual_glu" else _identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.dropout(self.proj(self.act(self.gate(x)) * self.act_up(self.up(x))))
        return y


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


MLPS: dict[str, type[nn.Module]] = {
    "relu": FeedForward,
    "gelu": FeedForward,
    "gelu_tanh": FeedForward,
    "relu2": FeedForward,
    **dict.fromkeys(GatedFeedForward.KINDS, GatedFeedForward),
}


class MixtureOfExperts(nn.Module):
    """Top-k routed experts; ``aux_loss`` holds the load-balancing loss of the last call."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k = config.n_experts, config.experts_top_k
        self.router = nn.Linear(config.n_embd, self.n_experts, bias=False)  # W_g
        self.experts = nn.ModuleList(MLPS[config.mlp](config) for _ in range(self.n_experts))
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (N, d_model), N = B·T tokens
        logits = self.router(x).float()  # (N, E)
        top_logits, top_idx = logits.topk(self.top_k, dim=-1)  # (N, k)
        gates = torch.softmax(top_logits, dim=-1).to(x.dtype)  # renormalised over the chosen k
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(top_idx == e)
            if token.numel():
                y.index_add_(0, token, expert(x[token]) * gates[token, slot, None])
        # load balancing: E · Σ_e f_e · P_e, minimal (= 1) when routing is uniform
        f = torch.bincount(top_idx.flatten(), minlength=self.n_experts).float() / top_idx.numel()
        p = torch.softmax(logits, dim=-1).mean(dim=0)
        self.aux_loss = self.n_experts * (f * p).sum()
        return y.reshape(shape)


def make_mlp(config: GPTConfig) -> nn.Module:
    """The feed-forward sublayer named by ``config.mlp`` (a mixture when ``n_experts > 1``)."""
    return MixtureOfExperts(config) if config.n_experts > 1 else MLPS[config.mlp](config)


def ffn_param_count(d_model: int, d_ff: int, gated: bool, bias: bool) -> int:
    """Parameters of one dense FFN: ``2·d·d_ff (+ d_ff + d)`` ungated; ``3·d·d_ff`` gated.

    At ``d_ff = 4·d`` this is ``8·d²`` plus ``5·d`` biases.
    """
    mats = (3 if gated else 2) * d_model * d_ff
    biases = ((2 if gated else 1) * d_ff + d_model) if bias else 0
    return mats + biases


__all__ = [
    "ACTIVATIONS",
    "MLPS",
    "FeedForward",
    "GatedFeedForward",
    "MixtureOfExperts",
    "make_mlp",
    "ffn_param_count",
    "gelu",
    "gelu_tanh",
    "relu2",
]
