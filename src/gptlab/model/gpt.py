"""The decoder-only transformer (blueprint §2 and the pipeline of "Transformer Fundamentals").

h⁽⁰⁾_i = e_{x_i} + p_i                          token embedding + position (eq. 2.1)
h⁽ˡ⁾   = Block_l(h⁽ˡ⁻¹⁾),  l = 1..N              attention + FFN, residual + norm
P(x_t | x_<t) = softmax(h_out⁽ᵗ⁻¹⁾·W_eᵀ)         output head tied to the embedding (eq. 9)
L(θ) = −Σ_t log P_θ(x_t | x_<t)                 cross-entropy, averaged over tokens (eq. 10)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gptlab.errors import GptlabError
from gptlab.model.block import Block
from gptlab.model.config import GPTConfig
from gptlab.model.kvcache import KVCache, LayeredCache
from gptlab.model.loss import HEAD_LOSSES
from gptlab.model.mlp import MixtureOfExperts
from gptlab.model.norms import NORMS, make_norm
from gptlab.model.positional import POSITIONAL

if TYPE_CHECKING:
    from gptlab.model.lora import LoRASpec


@dataclass
class ModelOutput:
    """Everything one forward pass can report."""

    logits: torch.Tensor | None  # (B, T, vocab_size), (B, 1, vocab_size) with last_only; None: chunked loss
    loss: torch.Tensor | None = None  # mean cross-entropy (+ MoE balancing loss)
    aux_loss: torch.Tensor | None = None  # MoE load-balancing loss, summed over layers
    hidden_states: list[torch.Tensor] | None = None  # residual stream: input + after each block
    attentions: list[torch.Tensor] | None = None  # per layer (B, H, T, T_k), from the plain path
    cross_attentions: list[torch.Tensor] | None = None  # encoder–decoder: per layer (B, H, T, S)
    encoder_attentions: list[torch.Tensor] | None = None  # encoder–decoder: per layer (B, H, S, S)


class GPT(nn.Module):
    """A GPT built from ``GPTConfig``: ``model(idx)`` → logits; ``model(idx, targets)`` → (logits, loss).

    ``config.causal = False`` (``arch="encoder"``) makes every block bidirectional: a
    BERT-style encoder whose logits at position i predict the token there (masked LM).
    """

    block_type: type[Block] = Block
    #: the context it was pre-trained with, set where a run fine-tunes it on other windows
    #: (train.init); unset otherwise (checkpoint.model reads it with getattr)
    pretrained_context: int
    #: the adapters' description, set by model.lora.apply_lora (in the instance's __dict__); unset otherwise
    lora_spec: LoRASpec

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.loss_impl, self.keep_logits = "plain", True  # set_loss_impl
        self.wte = nn.Embedding(config.padded_vocab_size, config.n_embd)  # W_e (+ padding rows)
        self.positional = POSITIONAL[config.pos](config)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(self.block_type(config) for _ in range(config.n_layer))
        # pre-norm stacks end with a norm; a post-norm block's output is already normalised
        self.norm_f = (
            make_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
            if config.norm_placement == "pre"
            else nn.Identity()
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # eq. 9: logits = h·W_eᵀ, one shared matrix
        self.apply(self._init_weights)
        with torch.no_grad():  # padding rows are never a token: zero, and kept so (no gradient reaches them)
            self.wte.weight[config.vocab_size :].zero_()
            self.lm_head.weight[config.vocab_size :].zero_()

    # ------------------------------------------------------------------ init
    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2: N(0, 0.02) everywhere; residual output projections N(0, 0.02/√(2·n_layer))."""
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            if getattr(module, "residual_out", False):
                if self.config.zero_init_residual:
                    nn.init.zeros_(module.weight)
                else:
                    nn.init.normal_(module.weight, mean=0.0, std=std / math.sqrt(2 * self.config.n_layer))
            else:
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)

    # --------------------------------------------------------------- options
    def set_attention_impl(self, impl: str) -> GPT:
        """Choose the attention path of every layer: ``"sdpa"`` (fast) or ``"plain"`` (the equation)."""
        from gptlab.model.attention import ATTENTION_PATHS, CausalSelfAttention
        from gptlab.model.cross_attention import CrossAttention

        if impl not in ATTENTION_PATHS:
            raise GptlabError(f"unknown attention path {impl!r}; choose one of {', '.join(ATTENTION_PATHS)}")
        for module in self.modules():
            if isinstance(module, (CausalSelfAttention, CrossAttention)):  # the modules with an ``impl``
                module.impl = impl
        return self

    def set_loss_impl(self, impl: str, keep_logits: bool = True) -> GPT:
        """How a forward with targets computes the head and loss (``gptlab.model.loss.HEAD_LOSSES``):
        ``"plain"`` (the logits, then their cross-entropy) or ``"chunked"`` (over chunks of rows;
        the output's ``logits`` are then None). ``keep_logits=False`` (training): a forward with
        targets returns no logits either, so a compiled graph need not output them."""
        if impl not in HEAD_LOSSES:
            raise GptlabError(f"unknown loss path {impl!r}; choose one of {', '.join(HEAD_LOSSES)}")
        self.loss_impl, self.keep_logits = impl, keep_logits
        return self

    @property
    def device(self) -> torch.device:
        return self.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: the token table's (an int8 table's ``compute_dtype``)."""
        return getattr(self.wte, "compute_dtype", self.wte.weight.dtype)

    # --------------------------------------------------------------- forward
    def run(
        self,
        idx: torch.Tensor,  # (B, T) token ids
        targets: torch.Tensor | None = None,  # (B, T); −1 is ignored
        *,
        pos: torch.Tensor | None = None,  # (T,) or (B, T); default: cache.length + arange(T)
        cache: LayeredCache | None = None,
        attn_mask: torch.Tensor | None = None,  # bool, broadcastable to (B, 1, T, T_k)
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        last_only: bool = False,  # compute logits for the last position only (generation)
    ) -> ModelOutput:
        """The whole forward pass, with every optional output."""
        pos = self._positions(idx, pos, cache)
        if isinstance(cache, KVCache):
            cache.advance(idx.size(1))  # its views write at [length, length + T), read [0, length + T)
        x = self.drop(self.positional.embed(self.wte(idx), pos))  # h⁽⁰⁾ = e_x + p: (B, T, d_model)
        x, hidden, attentions = self._stack(
            self.blocks, x, pos, self.positional, cache, attn_mask, output_attentions, output_hidden_states
        )
        return self._head(x, targets, last_only, hidden, attentions)

    def _positions(
        self, idx: torch.Tensor, pos: torch.Tensor | None, cache: LayeredCache | None
    ) -> torch.Tensor:
        """``pos`` if given, else ``cache.length + arange(T)`` (a ``KVCache``; 0 otherwise), checked
        against ``block_size``."""
        if idx.dim() != 2:
            raise GptlabError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        if pos is not None:
            return pos
        T = idx.size(1)
        start = cache.length if isinstance(cache, KVCache) else 0
        if start + T > self.config.block_size:
            raise GptlabError(
                f"sequence of {start + T} tokens exceeds the context length "
                f"block_size={self.config.block_size}; shorten the input"
            )
        return torch.arange(start, start + T, device=idx.device)

    def _stack(
        self,
        blocks: nn.ModuleList,
        x: torch.Tensor,  # (B, T, d_model)
        pos: torch.Tensor,
        positional: nn.Module,
        cache: LayeredCache | None,
        attn_mask: torch.Tensor | None,
        output_attentions: bool,
        output_hidden_states: bool,
        **block_kwargs: Any,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, list[Any] | None]:
        """``h⁽ˡ⁾ = Block_l(h⁽ˡ⁻¹⁾)`` for each block → (h⁽ᴺ⁾, residual streams?, attention weights?)."""
        hidden = [x] if output_hidden_states else None
        attentions: list[Any] | None = [] if output_attentions else None
        for i, block in enumerate(blocks):
            layer_cache = cache[i] if cache is not None else None
            extra = {k: v[i] for k, v in block_kwargs.items()}  # per-layer arguments (cross K/V)
            x, weights = block(x, pos, positional, layer_cache, attn_mask, output_attentions, **extra)
            if hidden is not None:
                hidden.append(x)
            if attentions is not None:
                assert weights is not None
                attentions.append(weights)
        return x, hidden, attentions

    def _head(
        self,
        x: torch.Tensor,  # (B, T, d_model), the last block's output
        targets: torch.Tensor | None,
        last_only: bool,
        hidden: list[torch.Tensor] | None,
        attentions: list[torch.Tensor] | None,
    ) -> ModelOutput:
        """Final norm, logits ``h·W_eᵀ`` (soft-capped if set) and the cross-entropy over targets ≠ −1."""
        x = self.norm_f(x)
        if last_only:
            x = x[:, -1:, :]
        head_loss = HEAD_LOSSES[self.loss_impl]
        # (B, T, padded_vocab_size), or None when the chunked loss never forms them
        logits, loss = head_loss(self.lm_head, x, targets, self.config.vocab_size, self.config.logit_softcap)
        if targets is not None and not self.keep_logits:
            logits = None  # the loss alone: the graph's output need not hold (B, T, V) logits
        aux = self._aux_loss()
        if loss is not None and aux is not None:
            loss = loss + self.config.moe_aux_weight * aux
        if logits is not None and logits.size(-1) != self.config.vocab_size:
            logits = logits[..., : self.config.vocab_size]  # the padding columns are never a token
        return ModelOutput(
            logits=logits, loss=loss, aux_loss=aux, hidden_states=hidden, attentions=attentions
        )

    def _aux_loss(self) -> torch.Tensor | None:
        if "_moe_layers" not in self.__dict__:  # found once, not on every decode step
            self.__dict__["_moe_layers"] = [m for m in self.modules() if isinstance(m, MixtureOfExperts)]
        losses = [m.aux_loss for m in self.__dict__["_moe_layers"] if m.aux_loss is not None]
        return torch.stack(losses).sum() if losses else None

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """``model(idx)`` → logits ``(B, T, vocab_size)``; ``model(idx, targets)`` → ``(logits, loss)``."""
        out = self.run(idx, targets, **kwargs)
        return out.logits if targets is None else (out.logits, out.loss)

    # ---------------------------------------------------------- parameters
    def num_params(self) -> dict[str, int]:
        """Parameter counts by part: embeddings, positions, attention, feed_forward, norms, head, total.

        A tied head counts once (under embeddings); ``total_without_positions`` omits the learned table.
        The vocabulary's padding rows (``vocab_multiple``) are not counted: they are never a token.
        """
        counts = dict.fromkeys(("embeddings", "positions", "attention", "feed_forward", "norms", "head"), 0)
        seen: set[int] = set()
        norm_types = tuple(NORMS.values())
        for name, module in self.named_modules():
            for p in module.parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                vocab_rows = name in ("wte", "lm_head") and p.dim() == 2  # padding rows left out
                n = self.config.vocab_size * p.size(1) if vocab_rows else p.numel()
                counts[_part_of(name, module, norm_types)] += n
        counts["total"] = sum(counts.values())
        counts["total_without_positions"] = counts["total"] - counts["positions"]
        return counts


def _part_of(name: str, module: nn.Module, norm_types: tuple[type, ...]) -> str:
    if isinstance(module, norm_types):
        return "norms"
    parts = {"wte": "embeddings", "positional": "positions", "enc_positional": "positions", "lm_head": "head"}
    head = name.split(".")[0]
    if head in parts:
        return parts[head]
    return "attention" if (".attn." in f".{name}." or ".cross_attn." in f".{name}.") else "feed_forward"
