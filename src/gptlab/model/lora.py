"""LoRA: low-rank adapters on frozen linear layers (Hu et al., 2021).

    y = W·x + b + (α/r)·B·A·dropout(x)        A ∈ R^{r×d_in}, B ∈ R^{d_out×r}, r ≪ min(d_in, d_out)

``A`` starts Kaiming-uniform and ``B`` at zero, so an adapted model computes exactly
the pretrained function until the first update. ``W`` and ``b`` (and every other
weight of the model) are frozen; only ``A`` and ``B`` train, in float32, while the
frozen base may be held in float32, bfloat16 or int8 (``BASE_FORMATS``; int8 is the
per-output-channel format of ``gptlab.model.quantized``, dequantised on the fly:
a QLoRA-like setup). Merging folds the adapters back: ``W ← W + (α/r)·B·A``.

Targets are named by the model's own layer names, matched as dotted suffixes of a
module's path: ``qkv``, ``attn.proj``, ``proj`` (attention and feed-forward), ``fc``,
``mlp.proj``, ``gate``, ``up``, ``lm_head``; aliases in ``TARGET_ALIASES``
(``head``, ``fc1``, ``fc2``).

The layers and the adapting itself live here, with the model, because loading a LoRA run, training
one and merging one all need them; what trains and how fast (LoRA+) is ``gptlab.train.lora``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.errors import GptlabError
from gptlab.model.quantized import InferenceLinear, Int8Linear, replace_linears

M = TypeVar("M", bound=nn.Module)  # a model, returned as the type it came in as

TARGET_ALIASES: dict[str, tuple[str, ...]] = {
    "head": ("lm_head",),
    "fc1": ("mlp.fc", "mlp.gate", "mlp.up"),
    "fc2": ("mlp.proj",),
}


@dataclass
class LoRASpec:
    """What was adapted and how; saved beside the adapters so they can be re-applied to the base."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["qkv", "attn.proj"])
    base_format: str = "float32"  # how the frozen base is held while training: BASE_FORMATS
    base: dict[str, Any] = field(default_factory=dict)  # {"path", "sha256", "kind"} of the pretrained weights

    @property
    def scaling(self) -> float:
        """``α/r``."""
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoRASpec:
        try:
            return cls(**data)
        except TypeError as exc:
            raise GptlabError(f"not a LoRA description: {exc}") from None


class _Int8Matmul(torch.autograd.Function):
    """``y = x·(q ⊙ s)ᵀ`` with the int8 weight dequantised per call; backward ``dx = dy·(q ⊙ s)``.

    Only the int8 ``q`` and the scales are kept for the backward pass, never a float copy of W.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(q, s)
        return F.linear(x, q.to(x.dtype) * s.to(x.dtype)[:, None])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        q, s = ctx.saved_tensors
        return grad @ (q.to(grad.dtype) * s.to(grad.dtype)[:, None]), None, None


class FrozenInt8Linear(Int8Linear):
    """The int8 inference linear, differentiable with respect to its input (for training adapters)."""

    def _matmul(self, x2: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return super()._matmul(x2)
        assert self.scales is not None
        y: torch.Tensor = _Int8Matmul.apply(x2, self.weight, self.scales)  # type: ignore[no-untyped-call]  # torch: Function.apply is untyped
        return y


def _base_bf16(model: nn.Module) -> None:
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)


def _base_int8(model: nn.Module) -> None:
    replace_linears(model, FrozenInt8Linear)
    _base_bf16(model)


#: How the frozen base weights are held while the adapters train.
BASE_FORMATS = {"float32": lambda model: None, "bfloat16": _base_bf16, "int8": _base_int8}


class LoRALinear(nn.Module):
    """``y = base(x) + (α/r)·B·A·dropout(x)``; ``base`` is frozen, ``A`` and ``B`` are float32."""

    def __init__(self, base: nn.Linear | InferenceLinear, rank: int, alpha: float, dropout: float) -> None:
        super().__init__()
        self.base = base
        d_in, d_out = base.in_features, base.out_features
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, d_in, device=device))  # A: (r, d_in)
        self.lora_B = nn.Parameter(torch.zeros(d_out, rank, device=device))  # B: (d_out, r) = 0
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear's own init
        self.scaling = alpha / rank
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.in_features, self.out_features = d_in, d_out
        self.disabled = False  # adapters_disabled: the frozen base alone

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., d_in)
        y: torch.Tensor = self.base(x)  # (..., d_out)
        if self.disabled:
            return y
        z = F.linear(self.dropout(x).to(self.lora_A.dtype), self.lora_A)  # A·x: (..., r)
        if y.dtype != z.dtype:  # a bf16/int8 base: the float32 update, then cast
            return y + (F.linear(z, self.lora_B) * self.scaling).to(y.dtype)
        # y + (α/r)·B·z in one matrix product (no separate passes to scale and add (..., d_out))
        out = torch.addmm(
            y.reshape(-1, y.size(-1)), z.reshape(-1, z.size(-1)), self.lora_B.t(), alpha=self.scaling
        )
        return out.view(y.shape)

    def delta_weight(self) -> torch.Tensor:
        """``(α/r)·B·A``: the change the adapter makes to W, shape (d_out, d_in)."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def extra_repr(self) -> str:
        return f"rank={self.lora_A.size(0)}, scaling={self.scaling:g}"


def _suffixes(target: str) -> tuple[str, ...]:
    return TARGET_ALIASES.get(target, (target,))


def _matches(name: str, suffixes: tuple[str, ...]) -> bool:
    return any(name == s or name.endswith("." + s) for s in suffixes)


def linear_names(model: nn.Module) -> list[str]:
    """Names of the model's linear layers (the possible targets)."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear | Int8Linear)]


def apply_lora(model: M, spec: LoRASpec) -> M:
    """Freeze ``model``, hold its base as ``spec.base_format``, and add adapters on ``spec.targets`` (in place)."""
    if spec.rank < 1:
        raise GptlabError(f"lora_rank must be at least 1, got {spec.rank}")
    if spec.base_format not in BASE_FORMATS:
        raise GptlabError(
            f"unknown LoRA base format {spec.base_format!r}; choose one of {', '.join(BASE_FORMATS)}"
        )
    config = getattr(model, "config", None)
    if getattr(config, "tie_embeddings", False) and any(
        _matches("lm_head", _suffixes(t)) for t in spec.targets
    ):
        raise GptlabError(
            "lora_targets names the output head, but this model ties it to the token embedding "
            "(tie_embeddings): an adapter there cannot be merged; leave head out"
        )
    names = linear_names(model)
    chosen = {t: [n for n in names if _matches(n, _suffixes(t))] for t in spec.targets}
    unknown = [t for t, found in chosen.items() if not found]
    if unknown or not spec.targets:
        short = sorted({".".join(n.split(".")[-2:]) for n in names})
        raise GptlabError(
            f"lora_targets {unknown or spec.targets} match no linear layer of this model; "
            f"its layers are {', '.join(short)} (or the aliases {', '.join(TARGET_ALIASES)})"
        )
    for p in model.parameters():
        p.requires_grad_(False)
    BASE_FORMATS[spec.base_format](model)
    targets = sorted({n for found in chosen.values() for n in found})
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(getattr(parent, child), spec.rank, spec.alpha, spec.dropout))
    model.lora_spec = spec  # type: ignore[assignment]
    return model


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, ``model`` computes its frozen base alone (every adapter off): the pretrained
    function, exactly, with no second copy of the weights (DPO's reference model, a KL anchor)."""
    layers = list(lora_layers(model).values())
    before = [layer.disabled for layer in layers]
    for layer in layers:
        layer.disabled = True
    try:
        yield model
    finally:
        for layer, state in zip(layers, before, strict=True):
            layer.disabled = state


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{"<layer>.lora_A": A, "<layer>.lora_B": B}`` of every adapter."""
    out: dict[str, torch.Tensor] = {}
    for name, layer in lora_layers(model).items():
        out[f"{name}.lora_A"], out[f"{name}.lora_B"] = layer.lora_A, layer.lora_B
    return out


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy saved adapters into a model prepared by ``apply_lora`` with the same spec."""
    expected = adapter_state(model)
    if set(expected) != set(state):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise GptlabError(
            f"{source}: adapters do not match the model (missing: {', '.join(missing[:4]) or 'none'}; "
            f"unexpected: {', '.join(extra[:4]) or 'none'})"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            if tensor.shape != expected[name].shape:
                raise GptlabError(
                    f"{source}: adapter {name} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(expected[name].shape)}"
                )
            expected[name].copy_(tensor)


@torch.no_grad()
def merge_lora(model: M) -> M:
    """Fold every adapter into its base (``W ← W + (α/r)·B·A``) and remove it; needs a float base."""
    for name, layer in lora_layers(model).items():
        base = layer.base
        if not isinstance(base, nn.Linear):
            raise GptlabError(
                f"{name}: cannot merge into a {type(base).__name__} base; load the base in float32"
            )
        base.weight += layer.delta_weight().to(base.weight.dtype)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, base)
    model.__dict__.pop("lora_spec", None)
    return model


def is_lora_model(model: object) -> bool:
    """True for a model prepared by ``apply_lora`` (it carries its ``lora_spec``)."""
    return "lora_spec" in getattr(model, "__dict__", {})


__all__ = [
    "BASE_FORMATS",
    "TARGET_ALIASES",
    "FrozenInt8Linear",
    "LoRALinear",
    "LoRASpec",
    "adapter_state",
    "adapters_disabled",
    "apply_lora",
    "is_lora_model",
    "linear_names",
    "load_adapter_state",
    "lora_layers",
    "merge_lora",
]
