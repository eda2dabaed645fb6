"""The language-modelling loss over a vocabulary whose head may be padded (blueprint eq. 10).

    L(θ) = −(1/N) Σ_t log softmax(z_t)[y_t]        over the real vocabulary only

A head padded to ``padded_vocab_size`` rows (``GPTConfig.vocab_multiple``) computes extra logits
``z_{V..V_pad−1}``. They are set to −∞ before the softmax: they then carry no probability, the loss
equals the unpadded model's, and their rows of the head receive exactly zero gradient. The row
length stays ``V_pad`` (a multiple of 64), which is what the fused GPU kernels like; under
``torch.compile`` the mask fuses into the log-softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mask_padding(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``logits`` (…, V_pad) with the columns ``≥ vocab_size`` set to −∞ (unchanged when V_pad = V)."""
    if logits.size(-1) <= vocab_size:
        return logits
    pad = torch.arange(logits.size(-1), device=logits.device) >= vocab_size  # (V_pad,)
    return logits.masked_fill(pad, float("-inf"))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` (B, T, V_pad) against ``targets`` (B, T); −1 is ignored."""
    flat = mask_padding(logits.reshape(-1, logits.size(-1)).float(), vocab_size)
    return F.cross_entropy(flat, targets.reshape(-1), ignore_index=-1)


# ------------------------------------------------------------ the head + loss, chosen by name
def _softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if cap is None else cap * torch.tanh(logits / cap)


def plain_head(
    head: nn.Module, x: torch.Tensor, targets: torch.Tensor | None, vocab_size: int, cap: float | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(logits (B, T, V_pad), loss or None)``: the whole batch's logits, then their cross-entropy."""
    logits = _softcap(head(x), cap)
    return logits, None if targets is None else next_token_loss(logits, targets, vocab_size)


def chunked_head(
    head: nn.Module, x: torch.Tensor, targets: torch.Tensor | None, vocab_size: int, cap: float | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(None, loss)`` with targets: the loss over chunks of rows, no logits formed
    (``gptlab.model.chunked_loss``). Without targets, or for a head that is not a plain
    bias-free ``nn.Linear`` (a LoRA-wrapped head), the plain path."""
    if targets is None or type(head) is not nn.Linear or head.bias is not None:
        return plain_head(head, x, targets, vocab_size, cap)
    from gptlab.model.chunked_loss import chunked_cross_entropy

    return None, chunked_cross_entropy(x, head.weight, targets, vocab_size, cap)


#: ``GPT.set_loss_impl(name)``: how the head and the loss are computed in a forward with targets
HEAD_LOSSES = {"plain": plain_head, "chunked": chunked_head}
