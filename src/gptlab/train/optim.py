"""Optimizers: AdamW with decoupled weight decay (blueprint §3.2), optionally Muon for hidden matrices.

AdamW, per parameter θ with gradient g:  m ← β₁m + (1−β₁)g,  v ← β₂v + (1−β₂)g²,
    θ ← θ − η·λ·θ − η·m̂/(√v̂ + ε)       (decay λ applied to matrices only, not to biases, norms or embeddings)

Muon (``torch.optim.Muon``) for the 2-D matrices inside the blocks: momentum, then the update
is orthogonalised by Newton–Schulz iterations, ``θ ← θ − η·NS(μB + g)``; every other
parameter (embeddings, head, norms, biases) stays with AdamW.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

from gptlab.errors import GptlabError
from gptlab.train.muon import muon_class, ns_dtype
from gptlab.train.muon_sharded import ShardedMuon

EMBEDDING_PREFIXES = ("wte.", "positional.", "lm_head.")


class OptimizerSettings(Protocol):
    """The settings an optimizer reads (a ``TrainConfig`` has them all)."""

    optimizer: str
    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    muon_lr: float
    muon_momentum: float
    muon_weight_decay: float
    dtype: str  # float32 pins Muon's Newton–Schulz to float32 too


class Optimizers:
    """Several optimizers stepped together (AdamW alone, or Muon + AdamW); each group keeps ``base_lr``."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> Iterator[dict[str, Any]]:
        for opt in self.optimizers.values():
            yield from opt.param_groups

    def set_lr_scale(self, scale: float) -> None:
        """``lr = base_lr · scale`` in every group (the schedule gives ``scale = η_t/η``)."""
        for group in self.param_groups:
            group["lr"] = group["base_lr"] * scale

    @property
    def takes_grad_scale(self) -> bool:
        """True when every optimizer is a fused AdamW, whose update can divide the gradients by a scale."""
        return all(
            isinstance(opt, torch.optim.AdamW) and opt.defaults.get("fused")
            for opt in self.optimizers.values()
        )

    def step(self, grad_scale: torch.Tensor | None = None) -> None:
        """One update of every optimizer; ``grad_scale`` (needs ``takes_grad_scale``): use ``g / grad_scale``.

        Fused AdamW divides inside its one pass over the parameters (the hook ``GradScaler`` uses),
        which spares a separate pass that scales every gradient in place.
        """
        for opt in self.optimizers.values():
            if grad_scale is not None:
                opt.grad_scale = grad_scale  # type: ignore[attr-defined]
            try:
                opt.step()
            finally:
                if grad_scale is not None:
                    opt.grad_scale = None  # type: ignore[attr-defined]

    def zero_grad(self) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise GptlabError(
                f"the checkpoint holds optimizer state for {', '.join(sorted(state))} but this run "
                f"uses {', '.join(sorted(self.optimizers))}; keep the optimizer setting when resuming"
            )
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


def _split(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(hidden matrices, other decayed matrices, undecayed) — each parameter once (a tied head is ``wte``)."""
    hidden, matrices, rest = [], [], []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        if p.dim() < 2 or name.startswith(EMBEDDING_PREFIXES[:2]):
            rest.append(p)  # biases, norm gains, token and position embeddings
        elif name.startswith("blocks."):
            hidden.append(p)
        else:
            matrices.append(p)  # an untied output head
    return hidden, matrices, rest


def _by_lr_scale(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group split by its parameters' ``lr_scale`` attribute (default 1): ``base_lr·lr_scale``.

    LoRA+ marks the adapters' ``B`` this way (``gptlab.train.lora.set_lr_ratio``)."""
    out = []
    for g in groups:
        by_scale: dict[float, list[nn.Parameter]] = {}
        for p in g["params"]:
            by_scale.setdefault(float(getattr(p, "lr_scale", 1.0)), []).append(p)
        out += [{**g, "params": ps, "base_lr": g["base_lr"] * s} for s, ps in by_scale.items()]
    return out


def _adamw(groups: list[dict[str, Any]], cfg: OptimizerSettings, device_type: str) -> torch.optim.AdamW:
    groups = [{**g, "lr": g["base_lr"]} for g in _by_lr_scale(groups) if g["params"]]
    fused = device_type in ("cuda", "cpu") and all(
        p.dtype.is_floating_point for g in groups for p in g["params"]
    )
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        fused=fused or None,
        foreach=None if fused else True,
    )


def build_optimizer(model: nn.Module, cfg: OptimizerSettings, device_type: str) -> Optimizers:
    """``cfg.optimizer``: ``adamw``, or ``muon`` (Muon for the blocks' matrices, AdamW for the rest)."""
    if cfg.optimizer not in OPTIMIZERS:
        raise GptlabError(f"unknown optimizer {cfg.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[cfg.optimizer](model, cfg, device_type)


def _adamw_only(model: nn.Module, cfg: OptimizerSettings, device_type: str) -> Optimizers:
    hidden, matrices, rest = _split(model)
    groups = [
        {"params": hidden + matrices, "weight_decay": cfg.weight_decay, "base_lr": cfg.lr},
        {"params": rest, "weight_decay": 0.0, "base_lr": cfg.lr},
    ]
    return Optimizers({"adamw": _adamw(groups, cfg, device_type)})


def _muon_and_adamw(model: nn.Module, cfg: OptimizerSettings, device_type: str) -> Optimizers:
    if not hasattr(torch.optim, "Muon"):
        raise GptlabError(
            f"optimizer=muon needs torch.optim.Muon (torch ≥ 2.9); this torch is "
            f"{torch.__version__}: upgrade torch or use optimizer=adamw"
        )
    hidden, matrices, rest = _split(model)
    settings: dict[str, Any] = {
        "lr": cfg.muon_lr,
        "momentum": cfg.muon_momentum,
        "weight_decay": cfg.muon_weight_decay,
    }
    if _ranks() > 1:  # under torchrun (DDP or FSDP): one owner rank orthogonalises each whole matrix
        muon: torch.optim.Optimizer = ShardedMuon(
            hidden, ns_dtype=ns_dtype(device_type, cfg.dtype), adjust_lr_fn="original", **settings
        )
    else:  # Newton–Schulz in float32 where bf16 is emulated
        muon = muon_class(device_type, cfg.dtype)(hidden, adjust_lr_fn="original", **settings)
    for group in muon.param_groups:
        group["base_lr"] = cfg.muon_lr
    groups = [
        {"params": matrices, "weight_decay": cfg.weight_decay, "base_lr": cfg.lr},
        {"params": rest, "weight_decay": 0.0, "base_lr": cfg.lr},
    ]
    if not matrices and not rest:  # every trainable tensor is a hidden matrix (LoRA adapters)
        return Optimizers({"muon": muon})
    return Optimizers({"muon": muon, "adamw": _adamw(groups, cfg, device_type)})


def _ranks() -> int:
    """The number of processes training together (1 outside torchrun)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


OPTIMIZERS: dict[str, Callable[[nn.Module, OptimizerSettings, str], Optimizers]] = {
    "adamw": _adamw_only,
    "muon": _muon_and_adamw,
}
