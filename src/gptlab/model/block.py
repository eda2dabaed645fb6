"""One transformer block: two sublayers, each wrapped in a residual connection and a norm.

Post-norm, the blueprint's eqs. 7–8 (the original Transformer):
    H' = LN(H + MultiHead(H)),   H_out = LN(H' + FFN(H'))
Pre-norm (GPT-2 and later; trains deeper stacks without warm-up tricks):
    H' = H + MultiHead(LN(H)),   H_out = H' + FFN(LN(H'))

An encoder block is the same block without the causal mask. A decoder block of an
encoder–decoder (document 004 §3, §8) has three sublayers, each in the same placement:
    H' = H + MaskedMultiHead(LN(H)),   H'' = H' + CrossAttn(LN(H'), H_enc),   H_out = H'' + FFN(LN(H''))
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from gptlab.model.attention import CausalSelfAttention
from gptlab.model.config import GPTConfig
from gptlab.model.cross_attention import CrossAttention, CrossKV
from gptlab.model.kvcache import LayerCache
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
    """Attention then feed-forward, each inside ``RESIDUALS[config.norm_placement]``.

    ``causal`` (default ``config.causal``): False makes it an encoder block.
    """

    def __init__(self, config: GPTConfig, causal: bool | None = None) -> None:
        super().__init__()
        self.norm1 = make_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
        self.attn = CausalSelfAttention(config, causal)
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
        x, weights = self._self_attention(x, pos, positional, cache, attn_mask, need_weights)
        x, _ = self.residual(x, self.norm2, self._ffn)
        return x, weights

    def _self_attention(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        positional: PositionalEncoding,
        cache: LayerCache | None,
        attn_mask: torch.Tensor | None,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The first sublayer: ``H' = H + MultiHead(LN(H))`` (pre) or ``LN(H + MultiHead(H))`` (post)."""
        attn = partial(
            self.attn,
            pos=pos,
            positional=positional,
            cache=cache,
            attn_mask=attn_mask,
            need_weights=need_weights,
        )
        return self.residual(x, self.norm1, attn)


class DecoderBlock(Block):
    """Masked self-attention, then cross-attention to the encoder output, then feed-forward.

    ``forward(..., cross=(K_enc, V_enc), source_mask=...)`` returns ``(x, (self_weights, cross_weights))``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config, causal=True)
        self.norm_cross = make_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
        self.cross_attn = CrossAttention(config)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,  # (B, T, d_model)
        pos: torch.Tensor,
        positional: PositionalEncoding,
        cache: LayerCache | None = None,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        *,
        cross: CrossKV,
        source_mask: torch.Tensor | None = None,  # bool (B, 1, 1, S); True = a real source token
    ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, torch.Tensor | None]]:
        x, weights = self._self_attention(x, pos, positional, cache, attn_mask, need_weights)
        cross_attn = partial(self.cross_attn, kv=cross, source_mask=source_mask, need_weights=need_weights)
        x, cross_weights = self.residual(x, self.norm_cross, cross_attn)
        x, _ = self.residual(x, self.norm2, self._ffn)
        return x, (weights, cross_weights)
