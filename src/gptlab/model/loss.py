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
