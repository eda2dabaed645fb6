"""Masked-token prediction with a bidirectional encoder (``gptlab fill``).

    P(x_i | x̃) = softmax(h_out⁽ⁱ⁾·W_eᵀ)      at every position i where x̃_i = [MASK]

The encoder sees the whole text at once (no causal mask), so each masked position is
predicted from the words on both sides. Predictions are independent per mask (BERT).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

MASK = "[MASK]"


@dataclass
class MaskPrediction:
    position: int  # token index of the mask
    top: list[tuple[str, float]]  # (token text, probability), best first


@torch.no_grad()
def fill_masks(
    model: GPT, tokenizer: Tokenizer, text: str, top_k: int = 5
) -> tuple[list[MaskPrediction], str]:
    """Top-``k`` predictions for every ``[MASK]`` in ``text``, and the text with each mask's best guess."""
    mask_id = mask_token_id(model, tokenizer)
    ids = tokenizer.encode(text, allowed_special={MASK})
    if mask_id not in ids:
        raise GptlabError(
            f'the text has no {MASK}; write one where a token is missing, e.g. "The cat {MASK}"'
        )
    predictions, filled = fill_ids(model, tokenizer, ids, top_k)
    return predictions, tokenizer.decode(filled)


def mask_token_id(model: GPT, tokenizer: Tokenizer) -> int:
    """The id of ``[MASK]``; refuses a causal model and a tokenizer without the token."""
    if getattr(model.config, "causal", True):
        raise GptlabError(
            "this model is causal (a decoder): it predicts the next token, not masked ones; "
            "train one with objective=mlm, or use `gptlab sample`"
        )
    mask_id = tokenizer.special_tokens.get(MASK)
    if mask_id is None:
        raise GptlabError(f"the tokenizer has no {MASK} token; was the model trained with objective=mlm?")
    return int(mask_id)


@torch.no_grad()
def fill_ids(
    model: GPT, tokenizer: Tokenizer, ids: list[int], top_k: int = 5
) -> tuple[list[MaskPrediction], list[int]]:
    """Top-``k`` predictions at every ``[MASK]`` of ``ids`` (none: no predictions), and ``ids`` with
    each mask replaced by its best guess; ``[MASK]`` itself is never an answer."""
    mask_id = mask_token_id(model, tokenizer)
    if top_k < 1:
        raise GptlabError(f"--top-k must be at least 1, got {top_k}")
    if len(ids) > model.config.block_size:
        raise GptlabError(
            f"the text has {len(ids)} tokens, more than the context of {model.config.block_size}"
        )
    where = [i for i, t in enumerate(ids) if t == mask_id]
    if not where:
        return [], list(ids)
    logits = model(torch.tensor([ids], device=model.device))[0].float()  # (T, vocab)
    logits[:, mask_id] = float("-inf")  # [MASK] is never an answer
    probs = torch.softmax(logits, dim=-1)
    out, filled = [], list(ids)
    for i in where:
        p, top = torch.topk(probs[i], min(top_k, probs.size(-1)))
        out.append(MaskPrediction(i, [(tokenizer.decode([int(t)]), float(q)) for q, t in zip(p, top)]))
        filled[i] = int(top[0])
    return out, filled
