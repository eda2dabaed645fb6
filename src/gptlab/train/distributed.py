"""The process group under ``torchrun``: one process per device, and the collectives the loop needs.

``torchrun --nproc_per_node=N -m gptlab train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; ``setup`` then joins the process group (gloo on CPU, nccl on CUDA).
Without them everything here is a no-op for a single process. How the model is spread
over the ranks (DDP or FSDP) is ``gptlab.train.strategy``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gptlab import hardware


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str) -> DistInfo:
    """Join the process group when launched by torchrun; pick this rank's device.

    ``device`` is checked first (``gptlab.hardware.resolve_device``: ``auto`` → CUDA, MPS or
    CPU; one error line for a device this machine lacks), and so is the number of processes
    on this node against its GPUs.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = hardware.resolve_device(device)
    if world <= 1:
        return DistInfo(device=device)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    hardware.check_ranks(device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=device)


def teardown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_flag(flag: bool, info: DistInfo) -> bool:
    """True on every rank if it is True on any (so all ranks stop together)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
