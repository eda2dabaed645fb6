"""How the model is spread over processes: ``STRATEGIES = {"ddp": ..., "fsdp": ...}``, chosen by name.

DDP: every rank holds the whole model, gradients, and AdamW moments; after the backward the
gradients are all-reduced, ``g = (1/W)·Σ_r g_r``. Per rank: ``4·P·b`` bytes (weights, gradients,
two moments).

FSDP2 (``torch.distributed.fsdp.fully_shard``, ZeRO-3): each parameter is split along dim 0
into ``W`` shards, one per rank. Before a block runs forward (and again before its backward)
its shards are all-gathered into the full weights; after the backward the gradients are
reduce-scattered so each rank keeps the mean gradient of its own shard, and AdamW updates
only that shard. Per rank: ``4·P·b/W`` bytes plus one block's full weights while it runs.

Wrapping order, as torchtitan and litgpt: activation checkpointing, then ``fully_shard`` on
each block, then on the root (which owns the embedding, the head and the final norm: a tied
head and embedding are one parameter in one group, gathered once). A mixed-precision policy
follows ``dtype``: parameters are gathered in bf16/fp16 and gradients reduced in fp32.
``reshard_after_forward`` frees the gathered weights after each block's forward (less memory,
one more all-gather in the backward). The same code runs with gloo on CPUs and nccl on GPUs.
Muon, which orthogonalises whole matrices, runs across the ranks as ``gptlab.train.muon_sharded``
(each matrix gathered to one owner rank, orthogonalised there, its rows scattered back).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from gptlab.inspect.size import Figure
    from gptlab.model import GPT, GPTConfig
    from gptlab.train.distributed import DistInfo

MIXED_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class StrategySettings(Protocol):
    """The settings a strategy reads (a ``TrainConfig`` has them all; a protocol, since
    ``gptlab.train.config`` imports this module to check ``strategy``)."""

    strategy: str
    activation_checkpointing: str
    compile: bool | str
    dtype: str
    reshard_after_forward: bool


@dataclass
class Strategy:
    """One way of running the model: ``wrap`` it, skip gradient sync in accumulation, and say how it saves."""

    name: str
    wrap: Callable[[GPT, StrategySettings, DistInfo], nn.Module]  # → the forward module
    skip_sync: Callable[[nn.Module], contextlib.AbstractContextManager[Any]]
    sharded: bool  # checkpoints are written by every rank through DCP (gptlab.checkpoint.sharded)
    gathered: Callable[[nn.Module], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    def no_sync(self, forward: nn.Module, skip: bool) -> contextlib.AbstractContextManager[Any]:
        """No gradient communication for this micro-batch (all but the last of an accumulation)."""
        return self.skip_sync(forward) if skip else contextlib.nullcontext()


# ------------------------------------------------------------------------ ddp
def _wrap_ddp(model: GPT, cfg: StrategySettings, info: DistInfo) -> nn.Module:
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    cuda = torch.device(info.device).type == "cuda"
    return DistributedDataParallel(model, device_ids=[info.local_rank] if cuda else None)


def _ddp_no_sync(forward: nn.Module) -> contextlib.AbstractContextManager[Any]:
    no_sync = getattr(forward, "no_sync", None)  # DistributedDataParallel's
    return no_sync() if no_sync is not None else contextlib.nullcontext()


# ----------------------------------------------------------------------- fsdp
def mixed_precision_policy(dtype: str) -> Any:
    """bf16/fp16 parameters for the forward and backward, fp32 gradient reduction; fp32: none."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    param = MIXED_PRECISION.get(dtype)
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=torch.float32 if param else None)


def _wrap_fsdp(model: GPT, cfg: StrategySettings, info: DistInfo) -> nn.Module:
    """``fully_shard`` each block, then the root; the model's parameters become sharded DTensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if cfg.compile:
        raise GptlabError("strategy=fsdp runs uncompiled here; set compile=false")
    if getattr(model, "blocks", None) is None or getattr(cfg, "objective", "causal") != "causal":
        raise GptlabError("strategy=fsdp supports the decoder with objective=causal")
    if cfg.dtype == "float16":
        raise GptlabError(
            "strategy=fsdp supports dtype=float32 or bfloat16 (float16 needs a sharded grad scaler)"
        )
    mesh = init_device_mesh(torch.device(info.device).type, (info.world_size,))
    policy = mixed_precision_policy(cfg.dtype)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=cfg.reshard_after_forward)
    # restored after evaluation (_fsdp_gathered); nn.Module's __setattr__ is typed for tensors and modules
    model.gptlab_reshard_after_forward = cfg.reshard_after_forward  # type: ignore[assignment]
    return model


@contextlib.contextmanager
def _fsdp_no_sync(forward: nn.Module) -> Iterator[None]:
    forward.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        forward.set_requires_gradient_sync(True)  # type: ignore[operator]


@contextlib.contextmanager
def _fsdp_gathered(model: nn.Module) -> Iterator[None]:
    """Every FSDP group's full weights gathered once and kept through the forwards (evaluation).

    Evaluation calls ``model.run`` (which bypasses the root's hooks) and ranks may evaluate
    different numbers of batches; with the weights gathered and ``reshard_after_forward`` off,
    a forward needs no collective. Costs the full weights (in the parameter dtype) meanwhile.
    """
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    model.set_reshard_after_forward(False)
    for m in groups:
        m.unshard()
    try:
        yield
    finally:
        for m in groups:
            m.reshard()
        model.set_reshard_after_forward(bool(getattr(model, "gptlab_reshard_after_forward", True)))


STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy("ddp", _wrap_ddp, _ddp_no_sync, sharded=False),
    "fsdp": Strategy("fsdp", _wrap_fsdp, _fsdp_no_sync, sharded=True, gathered=_fsdp_gathered),
}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise GptlabError(f"strategy must be one of {', '.join(STRATEGIES)}; got {name!r}")
    return STRATEGIES[name]


def prepare_model(model: GPT, cfg: StrategySettings, info: DistInfo) -> tuple[Strategy, nn.Module]:
    """Activation checkpointing, then the strategy's wrapping: ``(strategy, forward module)``.

    Build the optimizer after this: under FSDP it must see the sharded parameters.
    """
    from gptlab.train.checkpointing import apply_activation_checkpointing

    strategy = get_strategy(cfg.strategy)
    apply_activation_checkpointing(model, cfg.activation_checkpointing)
    if not info.enabled:  # one process: nothing to spread; checkpoints stay single-file
        return STRATEGIES["ddp"], model
    return strategy, strategy.wrap(model, cfg, info)


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """‖g‖₂ over all gradients as a plain tensor (under FSDP the shards' squares are summed across ranks)."""
    norm = torch.nn.utils.get_total_norm(grads)
    full = getattr(norm, "full_tensor", None)
    return full() if full is not None else norm


def local_bytes(model: nn.Module, optimizer: Any) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (its shards under FSDP)."""

    def size(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    params = {id(p): p for p in model.parameters()}.values()
    out = {
        "params": sum(size(p) for p in params),
        "grads": sum(size(p.grad) for p in params if p.grad is not None),
        "optimizer": 0,
    }
    for opt in getattr(optimizer, "optimizers", {"": optimizer}).values():
        for state in opt.state.values():
            out["optimizer"] += sum(size(v) for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
    return out


def per_rank_memory(config: GPTConfig, strategy: str, world: int, b: int) -> list[Figure]:
    """``gptlab size --strategy S --world-size W``: weights + gradients + AdamW moments held by one rank.

    DDP: ``4·P·b`` on every rank. FSDP: each parameter of shape ``(d₀, …)`` keeps ``⌈d₀/W⌉`` rows
    per rank (padded, as FSDP2 stores it), so ``≈ 4·P·b/W``, plus the full weights of the block
    being run and of the next one (prefetched) while they are gathered.
    """
    from gptlab.inspect.size import Figure, meta_model

    get_strategy(strategy)
    if world < 1:
        raise GptlabError(f"--world-size must be ≥ 1, got {world}")
    model = meta_model(config)
    params = list({id(p): p for p in model.parameters()}.values())
    full = sum(p.numel() for p in params)
    per_rank = full
    if strategy == "fsdp":
        per_rank = sum(-(-p.shape[0] // world) * (p.numel() // max(p.shape[0], 1)) for p in params)
    figures = [
        Figure(
            f"{strategy} per rank (W={world})",
            4 * per_rank * b,
            "bytes",
            "4·P·b" if strategy == "ddp" else "4·Σ⌈d₀/W⌉·(numel/d₀)·b ≈ 4·P·b/W",
            f"4·{per_rank}·{b}",
            "weights, gradients and AdamW's two moments held by one rank",
        )
    ]
    if strategy == "fsdp":
        block = sum(p.numel() for p in model.blocks[0].parameters())
        figures.append(
            Figure(
                "fsdp gathered blocks",
                2 * block * b,
                "bytes",
                "2·P_block·b",
                f"2·{block}·{b}",
                "the running block's full weights and the next one's (prefetched), freed after use; "
                f"per-rank state is {per_rank / full:.3f}× DDP's",
            )
        )
    return figures
