"""LoRA in training: which parameters train and at what rate.

The adapter layers, ``apply_lora`` and merging are the model's (``gptlab.model.lora``); here the
trainer's side: LoRA+ marks each ``B`` with its own learning-rate scale (``set_lr_ratio``, a group of
its own in ``gptlab.train.optim``), and ``trainable_fraction`` counts what trains.
"""

from __future__ import annotations

from typing import TypeVar

from torch import nn

from gptlab.model.lora import lora_layers

M = TypeVar("M", bound=nn.Module)  # a model, returned as the type it came in as


def set_lr_ratio(model: M, ratio: float) -> M:
    """LoRA+ (Hayou et al., 2024): ``B`` learns at ``ratio·η``, ``A`` at ``η``.

    Marks each ``B`` with ``lr_scale``, which ``gptlab.train.optim`` turns into its own group;
    B starts at zero and carries the update, A only a random projection to start from."""
    for layer in lora_layers(model).values():
        layer.lora_B.lr_scale = ratio  # type: ignore[attr-defined]
    return model


def trainable_fraction(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (each shared tensor once)."""
    seen: dict[int, nn.Parameter] = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in seen.values())
    return sum(p.numel() for p in seen.values() if p.requires_grad), total


__all__ = ["set_lr_ratio", "trainable_fraction"]
