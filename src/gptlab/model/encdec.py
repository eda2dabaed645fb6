"""The encoder–decoder transformer (document 004 §3 "Complete Transformer Architecture", §8).

    H_enc = Encoder(e_src + p_src)                    bidirectional blocks, padding mask only
    H⁽ˡ⁾  = DecoderBlock_l(H⁽ˡ⁻¹⁾, H_enc)              masked self-attn → cross-attn → FFN
    P(y_t | y_<t, x) = softmax(h_out⁽ᵗ⁻¹⁾·W_eᵀ)        one embedding W_e for source, target and output
    L(θ) = −Σ_t log P_θ(y_t | y_<t, x)                 cross-entropy over target tokens (−1 ignored)

Every option of ``GPTConfig`` applies to both stacks (positions, norms and their
placement, feed-forward networks, GQA, dropout); ``n_encoder_layer`` blocks encode,
``n_layer`` blocks decode. The decoder's causal self-attention uses the same KV cache
as a GPT, and ``bind(source)`` returns a decoder whose cross-attention keys and values
were computed once, which the generation code drives exactly like a GPT.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from gptlab.errors import GptlabError
from gptlab.model.block import Block, DecoderBlock
from gptlab.model.config import GPTConfig
from gptlab.model.cross_attention import CrossKV
from gptlab.model.gpt import GPT, ModelOutput
from gptlab.model.kvcache import KVCache, LayeredCache
from gptlab.model.norms import make_norm
from gptlab.model.positional import POSITIONAL


class EncoderDecoder(GPT):
    """``model.run(target_in, targets, source=src, source_mask=m)``: a GPT decoder that also reads a source."""

    block_type = DecoderBlock

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        assert config.n_encoder_layer
        self.enc_positional = POSITIONAL[config.pos](config)
        self.enc_blocks = nn.ModuleList(Block(config, causal=False) for _ in range(config.n_encoder_layer))
        self.enc_norm = (
            make_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
            if config.norm_placement == "pre"
            else nn.Identity()
        )
        self.apply(self._init_weights)

    # --------------------------------------------------------------- encoder
    def encode(
        self,
        source: torch.Tensor,  # (B, S) token ids, right-padded
        source_mask: torch.Tensor | None = None,  # (B, S) bool, True = a real token
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """``H_enc`` (B, S, d_model) and, if asked, the encoder's attention weights per layer."""
        if source.dim() != 2 or source.size(1) == 0:
            raise GptlabError(f"source must have shape (B, S) with S ≥ 1, got {tuple(source.shape)}")
        S = source.size(1)
        if S > self.config.block_size:
            raise GptlabError(
                f"a source of {S} tokens exceeds the context length block_size={self.config.block_size}; "
                f"shorten it"
            )
        pos = torch.arange(S, device=source.device)
        x = self.drop(self.enc_positional.embed(self.wte(source), pos))
        mask = _key_mask(source_mask)
        x, _, attentions = self._stack(
            self.enc_blocks, x, pos, self.enc_positional, None, mask, output_attentions, False
        )
        return self.enc_norm(x), attentions

    def cross_kv(self, memory: torch.Tensor) -> list[CrossKV]:
        """Each decoder layer's ``K_enc, V_enc`` of the encoder output: computed once per source."""
        return [cast(DecoderBlock, block).cross_attn.memory_kv(memory) for block in self.blocks]

    # --------------------------------------------------------------- forward
    def run(
        self,
        idx: torch.Tensor,  # (B, T) target-side input ids (BOS + target[:-1])
        targets: torch.Tensor | None = None,  # (B, T); −1 is ignored (padding)
        *,
        source: torch.Tensor | None = None,  # (B, S) source ids
        source_mask: torch.Tensor | None = None,  # (B, S) bool, True = a real source token
        cross: Sequence[CrossKV] | None = None,  # precomputed cross_kv (generation); replaces source
        pos: torch.Tensor | None = None,
        cache: LayeredCache | None = None,
        attn_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        last_only: bool = False,
    ) -> ModelOutput:
        """Encode ``source`` (unless ``cross`` is given), then decode ``idx`` against it."""
        encoder_attentions = None
        if cross is None:
            if source is None:
                raise GptlabError("an encoder–decoder model needs a source: run(idx, source=ids)")
            memory, encoder_attentions = self.encode(source, source_mask, output_attentions)
            cross = self.cross_kv(memory)
        pos = self._positions(idx, pos, cache)
        if isinstance(cache, KVCache):
            cache.advance(idx.size(1))
        x = self.drop(self.positional.embed(self.wte(idx), pos))
        mask = [_key_mask(source_mask)] * len(self.blocks)
        x, hidden, weights = self._stack(
            self.blocks,
            x,
            pos,
            self.positional,
            cache,
            attn_mask,
            output_attentions,
            output_hidden_states,
            cross=cross,
            source_mask=mask,
        )
        self_w = [w[0] for w in weights] if weights is not None else None
        out = self._head(x, targets, last_only, hidden, self_w)
        if weights is not None:
            out.cross_attentions = [w[1] for w in weights]
            out.encoder_attentions = encoder_attentions
        return out

    def bind(self, source: Sequence[int] | torch.Tensor) -> BoundDecoder:
        """The decoder with ``source`` encoded once (for generation)."""
        return BoundDecoder(self, source)


def _key_mask(source_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) bool → (B, 1, 1, S): every query may see every real source token."""
    if source_mask is None:
        return None
    return source_mask.to(torch.bool)[:, None, None, :]


class BoundDecoder:
    """An ``EncoderDecoder`` whose source is encoded and whose cross-attention K/V are cached.

    It looks like a GPT to the generation code (``config``, ``positional``, ``device``,
    ``dtype``, ``run``), so ``BatchSession``, the samplers and beam search drive it
    unchanged; every row of a session shares this one source.
    """

    def __init__(self, model: EncoderDecoder, source: Sequence[int] | torch.Tensor) -> None:
        self.model, self.config, self.positional = model, model.config, model.positional
        src = torch.as_tensor(source, dtype=torch.long, device=model.device).reshape(1, -1)
        vocab = model.config.vocab_size
        if src.numel() == 0 or int(src.min()) < 0 or int(src.max()) >= vocab:
            raise GptlabError(f"the source must be 1 or more token ids in 0..{vocab - 1}")
        self.source = src
        with torch.inference_mode():
            memory, _ = model.encode(src)
            self.cross = model.cross_kv(memory)  # per layer (1, H_kv, S, d_k): computed once

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def training(self) -> bool:
        return self.model.training

    def run(self, idx: torch.Tensor, targets: torch.Tensor | None = None, **kwargs: Any) -> ModelOutput:
        return self.model.run(idx, targets, cross=self.cross, **kwargs)
