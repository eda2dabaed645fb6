"""Attention maps: the weights ``A = softmax(Q·Kᵀ/√d_k + M)`` of every layer and head.

They come from the plain attention path (``model.run(idx, output_attentions=True)``),
which computes the equation as written, so the maps are the exact weights the
model used. Row ``i`` of a head's map is how query position ``i`` spreads its
attention over positions ``j ≤ i``; every row sums to 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gptlab.inspect.inputs import token_ids
from gptlab.model import GPT


@torch.no_grad()
def attention_maps(model: GPT, tokenizer_or_ids: Any, text: str | None = None) -> torch.Tensor:
    """The attention weights of ``text``: a float tensor ``(L, H, T, T)``.

    ``attention_maps(model, tokenizer, "text")`` encodes the text;
    ``attention_maps(model, [1, 2, 3])`` takes token ids.
    """
    if text is None and _is_ids(tokenizer_or_ids):
        ids = token_ids(model, None, tokenizer_or_ids)
    else:
        ids = token_ids(model, tokenizer_or_ids, text if text is not None else "")
    was_training = model.training
    model.eval()
    try:
        idx = torch.tensor([ids], dtype=torch.long, device=model.device)
        out = model.run(idx, output_attentions=True)
    finally:
        model.train(was_training)
    assert out.attentions is not None
    return torch.stack([a[0].float() for a in out.attentions]).cpu()  # (L, H, T, T)


def _is_ids(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor) or (isinstance(obj, Sequence) and not isinstance(obj, str))


__all__ = ["attention_maps"]
