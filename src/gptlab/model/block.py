"""One transformer block: two sublayers, each wrapped in a residual connection and a norm.

Post-norm, the blueprint's eqs. 7–8 (the original Transformer):
    H' = LN(H + MultiHead(H)),   H_out = LN(H' + FFN(H'))
Pre-norm (GPT-2 and later; trains deeper stacks without warm-up tricks):
    H' = H + MultiHead(LN(H)),   H_out = H' + FFN(LN(H'))
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from gptlab.model.attention import CausalSelfAttention, LayerCache
from gptlab.model.config import GPTConfig
from gptlab.model.mlp import make_mlp
from gptlab.model.norms import make_norm
from gptlab.model.positional import PositionalEncoding

Sublayer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def pre_norm(
    x: torch.Tensor, norm: nn.Module, sublayer: Sublayer
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``H + F(LN(H))``."""
    y, extra = sublayer(norm(x))
    return x + y, extra


def post_norm(
    x: torch.Tensor, norm: nn.Module, sublayer: Sublayer
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``LN(H + F(H))``."""
    y, extra = sublayer(x)
    return norm(x + y), extra


RESIDUALS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {
    "pre": pre_norm,
    "post": post_norm,
}


class Block(nn.Module):
    """Attention then feed-forward, each inside ``RESIDUALS[config.norm_placement]``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.norm1 = make_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
        self.attn = CausalSelfAttention(config)
        self.norm2 = make_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
        self.mlp = make_mlp(config)
        self.residual = RESIDUALS[config.norm_placement]

    def _ffn(self, h: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.mlp(h), None

    def forward(
        self,
        x: torch.Tensor,  # (B, T, d_model)
        pos: torch.Tensor,
        positional: PositionalEncoding,
        cache: LayerCache | None = None,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attn = partial(
            self.attn,
            pos=pos,
            positional=positional,
            cache=cache,
            attn_mask=attn_mask,
            need_weights=need_weights,
        )
        x, weights = self.residual(x, self.norm1, attn)
        x, _ = self.residual(x, self.norm2, self._ffn)
        return x, weights
