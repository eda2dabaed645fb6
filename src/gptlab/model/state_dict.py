"""The mapping between a model and its state dict as saved: no file I/O.

A tied ``lm_head.weight`` (and an int8 head's ``lm_head.scales``, an int4 head's
``lm_head.scales_and_zeros``) is not stored: it is ``wte.weight``.
The vocabulary's padding rows (``GPTConfig.vocab_multiple``) are cut off when saving and appended as
zeros when loading, so a checkpoint holds exactly ``vocab_size`` rows whatever the padding.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gptlab.errors import GptlabError
from gptlab.model.gpt import GPT

#: one row per token (an int4 token table's ``scales`` and ``zeros`` too: (V, d/32))
VOCAB_ROWS = ("wte.weight", "lm_head.weight", "wte.scales", "lm_head.scales", "wte.zeros")


def model_state(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights as saved: a tied ``lm_head.weight`` is left out (it is ``wte.weight``),
    and the vocabulary's padding rows (``GPTConfig.vocab_multiple``) are cut off."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
        state.pop("lm_head.scales", None)
        state.pop("lm_head.scales_and_zeros", None)
    for name in VOCAB_ROWS:
        if name in state:
            state[name] = state[name][: model.config.vocab_size]
    return state


def pad_vocab(model: GPT, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with zero padding rows appended to the vocabulary tensors, as ``model`` holds them."""
    rows = model.config.padded_vocab_size - model.config.vocab_size
    if not rows:
        return state
    out = dict(state)
    for name in VOCAB_ROWS:
        if name in out:
            t = out[name]
            out[name] = torch.cat([t, t.new_zeros(rows, *t.shape[1:])])
    return out


def check_state(
    expected: dict[str, Any], state: dict[str, Any], source: str | os.PathLike[str], shapes: bool = True
) -> None:
    """A missing, extra or (``shapes``) mis-shaped tensor of ``state`` is a ``GptlabError`` naming ``source``."""
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise GptlabError(
            f"{source}: weights do not match config.json "
            f"(missing: {', '.join(missing[:5]) or 'none'}; unexpected: {', '.join(extra[:5]) or 'none'})"
        )
    for name, tensor in state.items() if shapes else ():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise GptlabError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)} but config.json "
                f"implies {tuple(expected[name].shape)}"
            )


def load_model_state(
    model: GPT, state: dict[str, torch.Tensor], source: str | os.PathLike[str], assign: bool = False
) -> None:
    """Copy ``state`` into ``model`` (``assign``: take the tensors themselves); mismatches name ``source``."""
    check_state(model_state(model), state, source)
    model.load_state_dict(pad_vocab(model, state), strict=not model.config.tie_embeddings, assign=assign)


__all__ = ["VOCAB_ROWS", "check_state", "load_model_state", "model_state", "pad_vocab"]
