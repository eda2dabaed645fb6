"""Muon across ranks: each hidden matrix has one owner rank, which orthogonalises it whole.

Muon's update (``gptlab.train.muon``) is ``θ ← (1 − η·λ)·θ − η·√max(1, A/C)·NS(U)``, with the
momentum ``B ← μ·B + (1−μ)·g`` and ``U = g + μ·(B − g)`` elementwise but ``NS(U)`` (Newton–Schulz)
a function of the whole A×C matrix. Under FSDP each rank holds only rows of ``θ``, ``g`` and ``B``;
under DDP every rank holds all of them and would orthogonalise every matrix itself. Here matrix ``i``
is owned by rank ``i mod W`` (as modded-nanogpt under DDP, and Moonshot's "Muon is scalable" for ZeRO):

    FSDP (``θ`` a DTensor sharded on rows):  U_r = momentum on rank r's rows (no communication)
        gather:  the owner receives every rank's rows U_r (each padded to ⌈A/W⌉ rows) → U (A×C)
        owner:   O = NS(U)
        scatter: rank r receives its rows O_r, and updates its own rows of θ
    DDP (``θ`` whole on every rank):  the owner computes O = NS(U); a broadcast from it gives O to all.

Every gather (or, under DDP, every owner's NS) is issued first, asynchronously; each owner
orthogonalises a matrix as soon as its gather has arrived and issues its scatter (broadcast) at
once, so the communication of the other matrices runs meanwhile. Each rank then computes ``1/W``
of the Newton–Schulz products. The numbers are those of one process: NS sees the same whole matrix
in the same precision (``ns_dtype``: bfloat16 where native, else float32, as ``muon_class``), and
the state is ``torch.optim.Muon``'s (``momentum_buffer``, sharded like its parameter under FSDP),
so checkpoints resume under either and DCP reshards them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from gptlab.train.muon import lr_ratio, newton_schulz


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's own piece (its rows under FSDP), or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


class ShardedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` for ranks in a process group: whole-matrix Newton–Schulz on one owner per matrix.

    Parameters may be DTensors sharded on dim 0 (FSDP2) or whole tensors replicated on every rank
    (DDP); each matrix is handled as its kind requires (``LAYOUTS``).
    """

    ns_dtype = torch.float32

    def __init__(self, params: Any, ns_dtype: torch.dtype = torch.float32, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        rank, world = dist.get_rank(), dist.get_world_size()
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            bufs: list[torch.Tensor] = []
            self._init_group(group, params, grads, bufs)
            mu = group["momentum"]
            updates = []
            for g, buf in zip(grads, bufs, strict=True):  # elementwise: on each rank's own piece
                g, buf = _local(g), _local(buf)
                buf.lerp_(g, 1 - mu)
                updates.append(g.lerp(buf, mu) if group["nesterov"] else buf)
            ns = self._orthogonaliser(group)
            pending = [
                LAYOUTS[_layout(p)](p, u, i % world, rank, world)  # issues each matrix's first collective
                for i, (p, u) in enumerate(zip(params, updates, strict=True))
            ]
            finished = [work.finish(ns) for work in pending]  # owners orthogonalise; results sent
            lr = float(group["lr"])
            for p, work, piece in zip(params, pending, finished, strict=True):
                work.wait()
                local = _local(p)
                local.mul_(1 - lr * group["weight_decay"])
                local.add_(piece.to(local.dtype), alpha=-lr * lr_ratio(group["adjust_lr_fn"], p.shape))
        return loss

    def _orthogonaliser(self, group: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
        def ns(u: torch.Tensor) -> torch.Tensor:
            return newton_schulz(u, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)

        return ns


class _Sharded:
    """One matrix sharded on rows (FSDP2): gather to the owner, NS there, scatter the rows back."""

    def __init__(self, p: torch.Tensor, u: torch.Tensor, owner: int, rank: int, world: int) -> None:
        self.owner, self.rank, self.world, self.rows = owner, rank, world, p.shape[0]
        per = -(-p.shape[0] // world)
        padded = u.new_zeros((per, *u.shape[1:]))
        padded[: u.shape[0]] = u
        self.parts = [torch.empty_like(padded) for _ in range(world)] if rank == owner else None
        self.mine = u.shape[0]  # FSDP2 splits dim 0 as torch.chunk: rank r holds rows [r·per, (r+1)·per)
        self.received = torch.empty_like(padded)
        self.gathering = dist.gather(padded, self.parts, dst=owner, async_op=True)
        self.scattering: Any = None

    def finish(self, ns: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Owner: wait for the rows, orthogonalise the whole matrix, scatter; all: start receiving."""
        chunks = None
        if self.rank == self.owner:
            self.gathering.wait()
            assert self.parts is not None
            whole = torch.cat(self.parts)[: self.rows]
            out = ns(whole).to(self.received.dtype)
            chunks = [
                torch.cat([c, c.new_zeros((self.received.shape[0] - c.shape[0], *c.shape[1:]))])
                for c in _chunks(out, self.world, self.received.shape[0])
            ]
        self.scattering = dist.scatter(self.received, chunks, src=self.owner, async_op=True)
        return self.received[: self.mine]

    def wait(self) -> None:
        self.gathering.wait()
        self.scattering.wait()


def _chunks(t: torch.Tensor, world: int, per: int) -> list[torch.Tensor]:
    """``world`` row blocks of ``per`` rows (the last ones shorter or empty), as FSDP2 shards dim 0."""
    return [t[min(r * per, t.shape[0]) : min((r + 1) * per, t.shape[0])] for r in range(world)]


class _Replicated:
    """One whole matrix on every rank (DDP): NS on the owner, broadcast to the others."""

    def __init__(self, p: torch.Tensor, u: torch.Tensor, owner: int, rank: int, world: int) -> None:
        self.owner, self.rank, self.u = owner, rank, u
        self.out = torch.empty_like(u)
        self.sending: Any = None

    def finish(self, ns: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.rank == self.owner:
            self.out.copy_(ns(self.u))
        self.sending = dist.broadcast(self.out, src=self.owner, async_op=True)
        return self.out

    def wait(self) -> None:
        self.sending.wait()


#: How a matrix is held across ranks → how its update is computed: ``LAYOUTS[name](p, u, owner, rank, world)``.
LAYOUTS: dict[str, type[_Sharded] | type[_Replicated]] = {"sharded": _Sharded, "replicated": _Replicated}


def _layout(p: torch.Tensor) -> str:
    return "sharded" if hasattr(p, "to_local") else "replicated"
