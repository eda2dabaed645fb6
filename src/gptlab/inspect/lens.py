"""The logit lens: what the model would predict if it stopped after block l.

    z⁽ˡ⁾ = head(norm_f(h⁽ˡ⁾_t)) = norm_f(h⁽ˡ⁾_t)·W_eᵀ       (soft-capped if the model caps its logits)
    p⁽ˡ⁾ = softmax(z⁽ˡ⁾)

for every residual stream h⁽⁰⁾ (the embeddings) … h⁽ᴺ⁾ (the last block's output) at one position t.
The final norm and the head are the model's own, so p⁽ᴺ⁾ is the model's next-token distribution;
a post-norm model has no final norm (its blocks end normalised), so the head reads h⁽ˡ⁾ as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gptlab.inspect.inputs import token_label
from gptlab.model import GPT
from gptlab.model.loss import plain_head

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


@torch.no_grad()
def lens_logits(model: GPT, hidden: torch.Tensor) -> torch.Tensor:
    """``head(norm_f(h))`` for residual streams ``hidden`` (N, d_model): logits (N, V), float32."""
    h = hidden.to(device=model.device, dtype=model.dtype)
    c = model.config
    logits, _ = plain_head(model.lm_head, model.norm_f(h), None, c.vocab_size, c.logit_softcap)
    assert logits is not None
    return logits[..., : c.vocab_size].float().cpu()


def logit_lens(
    model: GPT, tokenizer: Tokenizer | None, hidden: list[torch.Tensor], position: int = -1, top: int = 5
) -> list[dict[str, Any]]:
    """Per residual stream ``hidden[l]`` (T, d_model), the ``top`` tokens of ``p⁽ˡ⁾`` at ``position``.

    Each entry: ``{layer, top: [{id, token, prob, logit}], final: {id, token, prob, rank}}``, where
    ``final`` follows the model's own top token (that of the last stream) through the layers:
    its probability and rank (0 = first) under each layer's lens. ``layer`` 0 is the embeddings.
    """
    logits = lens_logits(model, torch.stack([h[position] for h in hidden]))  # (L + 1, V)
    probs = torch.softmax(logits, dim=-1)
    k = min(top, logits.size(-1))
    final_id = int(logits[-1].argmax())
    label = token_label(tokenizer, final_id)
    out = []
    for layer, (z, p) in enumerate(zip(logits, probs)):
        top_p, top_i = p.topk(k)
        rank = int((z > z[final_id]).sum())
        out.append(
            {
                "layer": layer,
                "top": [
                    {
                        "id": int(i),
                        "token": token_label(tokenizer, int(i)),
                        "prob": float(q),
                        "logit": float(z[i]),
                    }
                    for q, i in zip(top_p, top_i)
                ],
                "final": {"id": final_id, "token": label, "prob": float(p[final_id]), "rank": rank},
            }
        )
    return out


__all__ = ["lens_logits", "logit_lens"]
