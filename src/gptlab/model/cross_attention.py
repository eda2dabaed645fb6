"""Cross-attention: decoder queries over the encoder's output (document 004 §3 and §8).

    Q_dec = H_dec·W_Q,   K_enc = H_enc·W_K,   V_enc = H_enc·W_V
    CrossAttn(H_dec, H_enc) = softmax(Q_dec·K_encᵀ/√d_k + M_src)·V_enc,   then Concat(heads)·W_O

``M_src`` is the source's padding mask (0 for a real source token, −∞ for padding);
there is no causal mask and no positional encoding here (the encoder and decoder
streams already carry their positions). ``K_enc, V_enc`` depend only on the source,
so generation computes them once per source (``memory_kv``) and reuses them at every
decode step. GQA applies as in self-attention: ``H_kv`` key/value heads.
"""

from __future__ import annotations

import torch
from torch import nn

from gptlab.model.attention import ATTENTION_PATHS, kv_heads_shared_in_kernel, share_kv_heads, split_heads
from gptlab.model.config import GPTConfig
from gptlab.model.norms import RMSNorm

CrossKV = tuple[torch.Tensor, torch.Tensor]  # K_enc, V_enc: (B or 1, H_kv, S, d_k)


class CrossAttention(nn.Module):
    """``CrossAttn(H_dec, H_enc) = softmax(Q_dec·K_encᵀ/√d_k + M_src)·V_enc·W_O``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_kv_head is not None
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.q_dim, self.kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.q = nn.Linear(config.n_embd, self.q_dim, bias=config.bias)  # W_Q
        self.kv = nn.Linear(config.n_embd, 2 * self.kv_dim, bias=config.bias)  # [W_K | W_V]
        self.proj = nn.Linear(self.q_dim, config.n_embd, bias=config.bias)  # W_O
        self.proj.residual_out = True  # type: ignore[assignment]
        self.q_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else nn.Identity()
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.impl = "sdpa"

    def memory_kv(self, memory: torch.Tensor) -> CrossKV:
        """``K_enc = H_enc·W_K``, ``V_enc = H_enc·W_V`` from the encoder output (B, S, d_model)."""
        k, v = self.kv(memory).split([self.kv_dim, self.kv_dim], dim=-1)
        k = self.k_norm(split_heads(k, self.n_kv_head, self.head_dim))  # (B, H_kv, S, d_k)
        return k, split_heads(v, self.n_kv_head, self.head_dim)

    def forward(
        self,
        x: torch.Tensor,  # (B, T, d_model) decoder stream
        kv: CrossKV,  # from memory_kv; a batch of 1 serves every row (beams share a source)
        source_mask: torch.Tensor | None = None,  # bool (B, 1, 1, S); True = a real source token
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, _ = x.shape
        q = self.q_norm(split_heads(self.q(x), self.n_head, self.head_dim))  # (B, H, T, d_k)
        k, v = kv
        if k.size(0) != B:
            k, v = k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        path = "plain" if need_weights else self.impl
        gqa = self.n_kv_head != self.n_head and kv_heads_shared_in_kernel(path, x.device)
        if not gqa:
            k, v = share_kv_heads(k, v, self.n_head)  # (B, H, S, d_k)
        dropout_p = self.dropout if self.training else 0.0
        y, weights = ATTENTION_PATHS[path](q, k, v, source_mask, None, dropout_p, need_weights, False, gqa)
        y = y.transpose(1, 2).reshape(B, T, self.q_dim).to(x.dtype)
        return self.resid_dropout(self.proj(y)), weights
