"""Activation checkpointing: keep each block's input, recompute its inside in the backward pass.

Without it, backpropagation keeps every intermediate of every block alive until the backward
pass reaches it: about ``L·B·T·d·34`` numbers for ``L`` blocks (Korthikanti et al. 2022).
With ``blocks``, block ``l`` stores only its input ``h⁽ˡ⁻¹⁾`` (``B·T·d`` numbers); its
forward runs again during the backward, so one step costs about one more forward (≈ 4/3×
the FLOPs) and the activations shrink to ``L·B·T·d + one block's worth``. The gradients
are the same numbers (the recomputation is deterministic; dropout masks are replayed).

Chosen by name: ``ACTIVATION_CHECKPOINTING = {"none": ..., "blocks": ...}``. It works the
same for one process, DDP and FSDP (applied before sharding, as torchtitan does).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from gptlab.errors import GptlabError


def _none(model: nn.Module) -> nn.Module:
    return model


def _blocks(model: nn.Module) -> nn.Module:
    """Wrap each of ``model.blocks`` in ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``).

    The wrapper's state-dict hooks strip its ``_checkpoint_wrapped_module.`` prefix, so saved
    weights keep their names (``blocks.0.attn.…``).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        CheckpointWrapper,
        checkpoint_wrapper,
    )

    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise GptlabError("activation_checkpointing=blocks needs a model with blocks (the decoder)")
    for i, block in enumerate(blocks):
        if not isinstance(block, CheckpointWrapper):
            blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    return model


ACTIVATION_CHECKPOINTING: dict[str, Callable[[nn.Module], nn.Module]] = {"none": _none, "blocks": _blocks}


def apply_activation_checkpointing(model: nn.Module, mode: str) -> nn.Module:
    """``mode`` from ``ACTIVATION_CHECKPOINTING``; the model is changed in place and returned."""
    if mode not in ACTIVATION_CHECKPOINTING:
        raise GptlabError(
            f"activation_checkpointing must be one of {', '.join(ACTIVATION_CHECKPOINTING)}; got {mode!r}"
        )
    return ACTIVATION_CHECKPOINTING[mode](model)
