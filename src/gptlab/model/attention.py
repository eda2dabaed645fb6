"""Masked multi-head self-attention (blueprint §2.2.1, eqs. 2–5).

    Q = H·W_Q,  K = H·W_K,  V = H·W_V
    Attention(Q, K, V) = softmax(Q·Kᵀ/√d_k + M)·V       M_ij = 0 if j ≤ i else −∞
    MultiHead(H) = Concat(head_1, …, head_h)·W_O

With ``causal=False`` (an encoder, document 004 §8) there is no ``M``: every position
attends to every other; a padding mask (``attn_mask``) still hides padded keys.

Two paths compute the same function and are tested to agree to 1e-5 (float32):

* ``plain``: the equation written out; it can return the attention weights;
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-
  efficient kernels on GPU, a fused kernel on CPU).

With ``n_kv_head < n_head`` (GQA; MQA at 1) groups of ``n_head/n_kv_head`` query
heads share one key/value head, and a KV cache stores only the KV heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.model.config import GPTConfig
from gptlab.model.kvcache import LayerCache
from gptlab.model.norms import RMSNorm
from gptlab.model.positional import PositionalEncoding


def causal_mask(n_q: int, n_k: int, device: torch.device) -> torch.Tensor:
    """Boolean ``(n_q, n_k)`` mask, True where query ``i`` may see key ``j``.

    Queries are the last ``n_q`` of ``n_k`` positions: ``j ≤ i + (n_k − n_q)``.
    """
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)


def _allowed(
    n_q: int, n_k: int, attn_mask: torch.Tensor | None, causal: bool, device: torch.device
) -> torch.Tensor:
    """Which keys each query may see: ``attn_mask`` if given, else the causal mask, else all."""
    if attn_mask is not None:
        return attn_mask
    if causal:
        return causal_mask(n_q, n_k, device)
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device)


def _full_mask(
    n_q: int,
    n_k: int,
    attn_mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    device: torch.device,
    dtype: torch.dtype,
    causal: bool = True,
) -> torch.Tensor:
    """The additive mask ``M`` (plus the ALiBi bias), broadcastable to ``(B, H, n_q, n_k)``."""
    allowed = _allowed(n_q, n_k, attn_mask, causal, device)
    m = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))
    return m if bias is None else m + bias


def plain_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    dropout_p: float,
    need_weights: bool,
    causal: bool = True,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``softmax(Q·Kᵀ/√d_k + M)·V`` written out. q: (B, H, T_q, d_k); k, v: (B, H, T_k, d_k), or
    (B, H_kv, T_k, d_k) with ``enable_gqa`` (each key/value head shared by ``H/H_kv`` query heads).

    ``Q·Kᵀ/√d_k + M`` is one ``baddbmm`` (the scale and the mask applied as the product is
    written); the softmax runs in float32, with exact zeros where ``M = −∞``.
    """
    if enable_gqa:
        k, v = share_kv_heads(k, v, q.size(1))
    B, H, n_q, d_k = q.shape
    n_k = k.size(-2)
    m = _full_mask(n_q, n_k, attn_mask, bias, q.device, q.dtype, causal)
    if m.dim() > 2:  # per batch or per head (padding, ALiBi): one (T_q, T_k) matrix per (b, h)
        m = m.expand(B, H, n_q, n_k).reshape(B * H, n_q, n_k)
    q3, k3, v3 = q.reshape(B * H, n_q, d_k), k.reshape(B * H, n_k, d_k), v.reshape(B * H, n_k, d_k)
    scores = torch.baddbmm(m, q3, k3.transpose(1, 2), alpha=1 / math.sqrt(d_k))  # (B·H, T_q, T_k)
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)  # rows sum to 1
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    y = torch.bmm(dropped, v3).view(B, H, n_q, d_k)
    return y, (weights.view(B, H, n_q, n_k) if need_weights else None)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    dropout_p: float,
    need_weights: bool,
    causal: bool = True,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same function through ``F.scaled_dot_product_attention`` (``enable_gqa``: its kernel reads
    query head ``h``'s keys from head ``h·H_kv/H``)."""
    n_q, n_k = q.size(-2), k.size(-2)
    if attn_mask is None and bias is None:
        if n_q == 1 or not causal:  # one new token sees every cached key, or no M: no mask at all
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, enable_gqa=enable_gqa), None
        if n_q == n_k:
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=enable_gqa
            )
            return out, None
    if bias is None:
        mask = _allowed(n_q, n_k, attn_mask, causal, q.device)
    else:
        mask = _full_mask(n_q, n_k, attn_mask, bias, q.device, q.dtype, causal)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=enable_gqa)
    return out, None


def kv_heads_shared_in_kernel(path: str, device: torch.device) -> bool:
    """Whether attention through ``path`` on ``device`` reads shared key/value heads (GQA) where they
    are, rather than from a copy of every key per query head (``share_kv_heads``): the CPU's SDPA
    kernel does (``enable_gqa``, the same numbers). A decode step copied its whole cache at every
    layer otherwise (SmolLM2's 3 heads for 9 at 600 cached positions: 120 µs a layer against 39);
    the GPU kernels that take no ``enable_gqa`` get the copy.
    """
    return path == "sdpa" and device.type == "cpu"


ATTENTION_PATHS = {"plain": plain_attention, "sdpa": sdpa_attention}


def attention_dtype(activations: torch.dtype, stored: torch.dtype) -> torch.dtype:
    """The dtype queries attend in over a cache stored in another dtype: the wider of the two, for one
    query (a decode step) and for a prompt's many alike.

    A float32 cache under bf16 weights is the CPU's default (``default_cache_dtype``), where one query
    attends faster in float32 than in bf16. A prompt's pass could attend in bf16 in 0.43× the float32
    kernel's time (505 tokens, SmolLM2's heads, about 40 ms of a prefill), but bf16 attention rounds
    its probabilities ``softmax(QKᵀ/√d_k)`` to bf16 before they weight ``V``, and that changed greedy
    texts (SmolLM2: one of two prompts parted after 9 tokens; docs/benchmarks.md). A prompt therefore
    attends as a decode step does, in the cache's float32.
    """
    return torch.promote_types(activations, stored)


def split_heads(x: torch.Tensor, n_head: int, head_dim: int) -> torch.Tensor:
    """``(B, T, n_head·d_k)`` → ``(B, n_head, T, d_k)``."""
    B, T, _ = x.shape
    return x.view(B, T, n_head, head_dim).transpose(1, 2)


def share_kv_heads(k: torch.Tensor, v: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GQA/MQA: each of the ``H_kv`` key/value heads serves ``n_head/H_kv`` query heads."""
    rep = n_head // k.size(1)
    if rep == 1:
        return k, v
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


class CausalSelfAttention(nn.Module):
    """``MultiHead(H) = Concat(head_1..head_h)·W_O`` with causal masking, optional GQA, QK-norm.

    ``causal=False`` (default: ``config.causal``) drops the causal mask: bidirectional attention.
    """

    def __init__(self, config: GPTConfig, causal: bool | None = None) -> None:
        super().__init__()
        self.causal = bool(config.causal if causal is None else causal)
        assert config.n_kv_head is not None
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.q_dim, self.kv_dim = q_dim, kv_dim
        # W_Q, W_K, W_V fused into one matrix: H·[W_Q | W_K | W_V]
        self.qkv = nn.Linear(config.n_embd, q_dim + 2 * kv_dim, bias=config.bias)
        self.proj = nn.Linear(q_dim, config.n_embd, bias=config.bias)  # W_O
        self.proj.residual_out = True  # type: ignore[assignment]  # a flag for GPT._init_weights (scaled init)
        self.q_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else nn.Identity()
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.impl = "sdpa"

    def forward(
        self,
        x: torch.Tensor,  # (B, T, d_model)
        pos: torch.Tensor,  # (T,) or (B, T) absolute positions
        positional: PositionalEncoding,
        cache: LayerCache | None = None,
        attn_mask: torch.Tensor | None = None,  # bool, broadcastable to (B, 1, T, T_k); True = may attend
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = self.q_norm(split_heads(q, self.n_head, self.head_dim))  # (B, H, T, d_k)
        k = self.k_norm(split_heads(k, self.n_kv_head, self.head_dim))  # (B, H_kv, T, d_k)
        v = split_heads(v, self.n_kv_head, self.head_dim)
        q, k = positional.rotate(q, k, pos)
        if cache is not None:
            k, v = cache.update(k, v)  # all keys/values so far: (B, H_kv, T_k, d_k)
            if k.dtype != q.dtype:
                dt = attention_dtype(q.dtype, k.dtype)
                q, k, v = q.to(dt), k.to(dt), v.to(dt)
        bias = positional.bias(T, k.size(-2), x.device, q.dtype, causal=self.causal)
        path = "plain" if need_weights else self.impl
        gqa = self.n_kv_head != self.n_head and kv_heads_shared_in_kernel(path, x.device)
        if not gqa:
            k, v = share_kv_heads(k, v, self.n_head)  # (B, H, T_k, d_k)
        dropout_p = self.dropout if self.training else 0.0
        y, weights = ATTENTION_PATHS[path](
            q, k, v, attn_mask, bias, dropout_p, need_weights, self.causal, gqa
        )
        y = y.transpose(1, 2).reshape(B, T, self.q_dim).to(x.dtype)  # Concat(head_1..head_h)
        return self.resid_dropout(self.proj(y)), weights
