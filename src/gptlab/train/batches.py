"""A training batch (a tuple of tensors) and its copy to the device, shared by the objectives."""

from __future__ import annotations

from collections.abc import Iterable

import torch

Batch = tuple[torch.Tensor, ...]


def to_device(tensors: Iterable[torch.Tensor], device: str) -> Batch:
    """A batch's tensors on ``device``; to a GPU through pinned memory, so the copy is truly
    asynchronous (from pageable memory the driver may wait for the stream)."""
    pin = torch.device(device).type == "cuda"
    return tuple((t.pin_memory() if pin else t).to(device, non_blocking=True) for t in tensors)
