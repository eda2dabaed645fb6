"""Attention maps: the weights ``A = softmax(Q·Kᵀ/√d_k + M)`` of every layer and head.

They come from the plain attention path (``model.run(idx, output_attentions=True)``),
which computes the equation as written, so the maps are the exact weights the
model used. Row ``i`` of a head's map is how query position ``i`` spreads its
attention over positions ``j ≤ i``; every row sums to 1.

An encoder–decoder has three kinds (``seq2seq_maps``): the encoder's bidirectional
maps ``(L_enc, H, S, S)``, the decoder's causal maps ``(L, H, T, T)`` and the
cross-attention maps ``CrossAttn = softmax(Q_dec·K_encᵀ/√d_k)``, ``(L, H, T, S)``:
target position × source position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import torch

from gptlab.errors import GptlabError
from gptlab.inspect.inputs import token_ids
from gptlab.inspect.recording import ModelInput, record
from gptlab.model import GPT

if TYPE_CHECKING:
    from gptlab.model import EncoderDecoder
    from gptlab.tokenizers.base import Tokenizer


@torch.no_grad()
def attention_maps(
    model: GPT, tokenizer_or_ids: Tokenizer | Sequence[int] | torch.Tensor, text: str | None = None
) -> torch.Tensor:
    """The attention weights of ``text``: a float tensor ``(L, H, T, T)``.

    ``attention_maps(model, tokenizer, "text")`` encodes the text;
    ``attention_maps(model, [1, 2, 3])`` takes token ids.
    """
    if text is None and _is_ids(tokenizer_or_ids):
        ids = token_ids(model, None, tokenizer_or_ids)
    else:
        tokenizer = cast("Tokenizer", tokenizer_or_ids)  # ids come without text
        ids = token_ids(model, tokenizer, text if text is not None else "")
    return record(model, ModelInput(ids, [])).attentions["self"]  # (L, H, T, T)


@torch.no_grad()
def seq2seq_maps(
    model: EncoderDecoder,
    tokenizer: Tokenizer | None,
    source: str | Sequence[int],
    target: str | Sequence[int] | None = None,
) -> dict[str, Any]:
    """Encoder, decoder and cross-attention weights of an encoder–decoder, with the ids they read.

    ``target`` is the decoder input after BOS; by default the model's own greedy output
    for ``source`` (so the cross-attention map shows the alignment the model uses).
    """
    from gptlab.generate import SampleConfig
    from gptlab.generate.driver import target_ids

    src = token_ids(model, tokenizer, source) if isinstance(source, str) else list(source)
    bos = getattr(tokenizer, "eot_id", None)
    if bos is None:
        raise GptlabError("an encoder-decoder's tokenizer needs <|endoftext|> (its BOS)")
    if target is None:
        config = SampleConfig(temperature=0.0, max_new_tokens=model.config.block_size - 1, stop_tokens=[bos])
        tgt = target_ids(model, src, bos, config)[0]
    else:
        tgt = token_ids(model, tokenizer, target) if isinstance(target, str) else list(target)
    ids = [bos, *tgt][: model.config.block_size]
    maps = record(model, ModelInput(ids, [], src)).attentions
    return {
        "source_ids": src,
        "target_ids": ids,
        "encoder": maps["encoder"],  # (L_enc, H, S, S)
        "decoder": maps["self"],  # (L, H, T, T)
        "cross": maps["cross"],  # (L, H, T, S)
    }


def _is_ids(obj: object) -> TypeGuard[Sequence[int] | torch.Tensor]:
    return isinstance(obj, torch.Tensor) or (isinstance(obj, Sequence) and not isinstance(obj, str))


__all__ = ["attention_maps", "seq2seq_maps"]
