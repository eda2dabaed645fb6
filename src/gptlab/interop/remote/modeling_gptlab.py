"""transformers classes around gptlab's own model (the ``gptlab_*.py`` files beside this one).

* ``GptlabForCausalLM``   (``AutoModelForCausalLM``, ``pipeline("text-generation")``): a decoder;
* ``GptlabForMaskedLM``   (``AutoModelForMaskedLM``, ``pipeline("fill-mask")``): a bidirectional encoder;
* ``GptlabForSeq2SeqLM``  (``AutoModelForSeq2SeqLM``, ``pipeline("text2text-generation")``): an
  encoder–decoder.

Each holds the gptlab model as ``self.gpt`` (its tensors are ``gpt.<gptlab name>``) and only turns
transformers' arguments into gptlab's: ``attention_mask`` (1 = a real token) becomes gptlab's boolean
mask, and with left padding the positions count real tokens only. A decoder generates with gptlab's
own ``KVCache``, handed to ``generate`` as the output's ``cache`` and back (beam search reorders its
rows); the encoder–decoder's cache also holds each layer's cross-attention keys and values of the
source, computed once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import (
    BaseModelOutput,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    Seq2SeqLMOutput,
)

from .configuration_gptlab import GptlabConfig
from .gptlab_model import MODELS, GPTConfig, KVCache
from .gptlab_positional import PositionalEncoding

if TYPE_CHECKING:
    from .gptlab_model import EncoderDecoder

IGNORE = -100  # transformers' label for "no loss here"


def _key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1/0 → (B, 1, 1, T) bool, or None when every token is real."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :]


def _causal_inputs(
    attention_mask: torch.Tensor | None, T: int, past: int = 0
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(mask (B, 1, T, past + T), positions (B, T)) for a left-padded batch; (None, None) without padding.

    ``attention_mask`` covers the ``past`` cached tokens and the ``T`` new ones. A query sees the real
    keys up to itself (and itself, so that a padding row is not empty); positions count real tokens,
    so a padded prompt is encoded as it would be alone.
    """
    keys = _key_mask(attention_mask)
    if keys is None or attention_mask is None:
        return None, None
    n_k = past + T
    causal = torch.ones(T, n_k, dtype=torch.bool, device=keys.device).tril(diagonal=past)
    itself = torch.eye(T, n_k, dtype=torch.bool, device=keys.device).roll(past, dims=1)
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
    return (causal & keys) | itself, pos


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor | None, shift: bool) -> torch.Tensor | None:
    if labels is None:
        return None
    if shift:  # position t predicts token t + 1
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=IGNORE
    )


class GptlabPreTrainedModel(PreTrainedModel):
    """Builds ``config.gptlab`` with gptlab's own model classes (``MODELS[arch]``)."""

    config_class = GptlabConfig
    base_model_prefix = "gpt"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False

    def __init__(self, config: GptlabConfig) -> None:
        super().__init__(config)
        self.gpt_config = GPTConfig.from_dict(config.gptlab)
        self.gpt = MODELS[self.gpt_config.arch](self.gpt_config)
        if self.gpt_config.tie_embeddings:
            self._tied_weights_keys = {"gpt.lm_head.weight": "gpt.wte.weight"}
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Every weight comes from the file; only the buffers no file holds (RoPE angles, the sinusoid
        table, ALiBi slopes) are computed again, as gptlab computes them."""
        if isinstance(module, PositionalEncoding):
            device = next(iter(module.buffers()), torch.empty(0)).device
            if device.type == "meta":
                return
            with torch.device(device):
                fresh = type(module)(self.gpt_config)
            with torch.no_grad():
                for name, buffer in fresh.named_buffers(recurse=False):
                    getattr(module, name).copy_(buffer)

    def get_input_embeddings(self) -> nn.Module:
        return self.gpt.wte

    def get_output_embeddings(self) -> nn.Module:
        return self.gpt.lm_head

    def _outputs(self, out: Any) -> dict[str, Any]:
        return {
            "hidden_states": tuple(out.hidden_states) if out.hidden_states is not None else None,
            "attentions": tuple(out.attentions) if out.attentions is not None else None,
        }


class GptlabForCausalLM(GptlabPreTrainedModel, GenerationMixin):
    """A gptlab decoder: ``logits[b, t]`` predicts token ``t + 1``."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate gets gptlab's own KVCache from forward's output instead of a DynamicCache

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """``input_ids`` are the tokens after the ``cache`` (all of them without one)."""
        if use_cache and cache is None:
            B, device = input_ids.size(0), input_ids.device
            cache = KVCache(self.gpt_config, B, dtype=self.gpt.dtype, device=device)
        past = cache.length if cache is not None else 0
        mask, pos = _causal_inputs(attention_mask, input_ids.size(1), past)
        out = self.gpt.run(
            input_ids,
            pos=pos,
            cache=cache,
            attn_mask=mask,
            output_attentions=bool(output_attentions),
            output_hidden_states=bool(output_hidden_states),
        )
        return CausalLMOutputWithPast(
            loss=_lm_loss(out.logits, labels, shift=True),
            logits=out.logits,
            cache=cache,
            **self._outputs(out),
        )

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The tokens the cache has not seen yet (all of them on the first step, or without a cache)."""
        if cache is not None:
            input_ids = input_ids[:, cache.length :]
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "cache": cache,
            "use_cache": use_cache,
        }

    def _reorder_cache(self, cache: KVCache, beam_idx: torch.Tensor) -> KVCache:
        """Beam search: row ``i`` of every layer's keys and values becomes row ``beam_idx[i]``."""
        _reorder_kv(cache, beam_idx)
        return cache


class GptlabForMaskedLM(GptlabPreTrainedModel):
    """A gptlab bidirectional encoder: ``logits[b, t]`` predicts the token at ``t`` (masked LM)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput:
        out = self.gpt.run(
            input_ids,
            attn_mask=_key_mask(attention_mask),
            output_attentions=bool(output_attentions),
            output_hidden_states=bool(output_hidden_states),
        )
        return MaskedLMOutput(
            loss=_lm_loss(out.logits, labels, shift=False), logits=out.logits, **self._outputs(out)
        )


class _Encoder(nn.Module):
    """``get_encoder()`` of the encoder–decoder: ``last_hidden_state`` is gptlab's ``H_enc``."""

    def __init__(self, gpt: EncoderDecoder) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> BaseModelOutput:
        memory, _ = self.gpt.encode(input_ids, _source_mask(attention_mask))
        return BaseModelOutput(last_hidden_state=memory)


def _source_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    return None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()


class Seq2SeqCache:
    """The decoder's self-attention ``KVCache`` and each layer's cross-attention ``(K_enc, V_enc)``."""

    def __init__(self, self_attn: KVCache, cross: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.self_attn, self.cross = self_attn, cross

    @property
    def length(self) -> int:
        return self.self_attn.length


class GptlabForSeq2SeqLM(GptlabPreTrainedModel, GenerationMixin):
    """A gptlab encoder–decoder: the decoder starts from ``decoder_start_token_id`` (gptlab's
    ``<|endoftext|>``) and reads the encoded source through cross-attention."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate gets a Seq2SeqCache from forward's output instead

    def get_encoder(self, modality: str | None = None) -> nn.Module:  # transformers' signature
        return _Encoder(self.gpt)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        encoder_outputs: Any = None,
        labels: torch.Tensor | None = None,
        cache: Seq2SeqCache | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> Seq2SeqLMOutput:
        """``decoder_input_ids`` are the target tokens after the ``cache`` (all of them without one)."""
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("give decoder_input_ids (or labels, which are shifted right to make them)")
            start = torch.full_like(labels[:, :1], self.config.decoder_start_token_id)
            shifted = torch.cat([start, labels[:, :-1]], dim=1)
            decoder_input_ids = shifted.masked_fill(shifted == IGNORE, self.config.pad_token_id or 0)
        memory = encoder_outputs[0] if encoder_outputs is not None else None
        if cache is None:
            if memory is None:
                if input_ids is None:
                    raise ValueError(
                        "an encoder-decoder model needs input_ids (the source) or encoder_outputs"
                    )
                memory = self.get_encoder()(input_ids, attention_mask)[0]
            B, device = decoder_input_ids.size(0), decoder_input_ids.device
            kv = KVCache(self.gpt_config, B, dtype=self.gpt.dtype, device=device) if use_cache else None
            cache = Seq2SeqCache(kv, self.gpt.cross_kv(memory)) if kv is not None else None
            cross = cache.cross if cache is not None else self.gpt.cross_kv(memory)
        else:
            cross = cache.cross
        out = self.gpt.run(
            decoder_input_ids,
            cross=cross,
            source_mask=_source_mask(attention_mask),
            cache=cache.self_attn if cache is not None else None,
        )
        return Seq2SeqLMOutput(
            loss=_lm_loss(out.logits, labels, shift=False),
            logits=out.logits,
            cache=cache,  # type: ignore[arg-type]  # gptlab's own cache: generate hands it back to forward
            encoder_last_hidden_state=memory,
        )

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_outputs: Any = None,
        cache: Seq2SeqCache | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The target tokens the cache has not seen yet, against the source encoded once."""
        if cache is not None:
            input_ids = input_ids[:, cache.length :]
        return {
            "decoder_input_ids": input_ids,
            "attention_mask": attention_mask,
            "encoder_outputs": encoder_outputs,
            "cache": cache,
            "use_cache": use_cache,
        }

    def _reorder_cache(self, cache: Seq2SeqCache, beam_idx: torch.Tensor) -> Seq2SeqCache:
        """Beam search: row ``i`` becomes row ``beam_idx[i]``, in the self- and the cross-attention caches."""
        _reorder_kv(cache.self_attn, beam_idx)
        cache.cross = [(k.index_select(0, beam_idx), v.index_select(0, beam_idx)) for k, v in cache.cross]
        return cache


def _reorder_kv(cache: KVCache, beam_idx: torch.Tensor) -> None:
    for view in cache:
        store = view.store
        store.k, store.v = store.k.index_select(0, beam_idx), store.v.index_select(0, beam_idx)
