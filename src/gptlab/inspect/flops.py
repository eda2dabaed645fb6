"""FLOPs per token of a ``GPTConfig`` (Kaplan et al. 2020), and the peak of the device it runs on.

    forward   = 2·N + 2·L·T·d      N: the weights a token multiplies (``gptlab.inspect.params``);
                                   2·L·T·d: Q·Kᵀ and A·V, averaged over the causal positions
    training  = 3·forward          the backward costs about twice the forward
    MFU       = training FLOPs per token · tokens/s / (peak FLOP/s · devices)

This one formula serves ``gptlab size`` and the MFU that ``gptlab train`` shows. The peaks are the
dense (no sparsity) tensor-core figures of each card's datasheet, for 16-bit and for float32 numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from gptlab.inspect.figures import Figure
from gptlab.inspect.params import matmul_params
from gptlab.model.config import GPTConfig


@dataclass(frozen=True)
class Peak:
    """A device's dense peak in FLOP/s: ``bf16`` (and fp16) tensor cores, and plain float32."""

    name: str
    bf16: float
    fp32: float


# matched in order against torch.cuda.get_device_name(): the longer names first
PEAKS = (
    Peak("H200", 989e12, 67e12),
    Peak("H100", 989e12, 67e12),
    Peak("GH200", 989e12, 67e12),
    Peak("A100", 312e12, 19.5e12),
    Peak("L40S", 362e12, 91.6e12),
    Peak("L40", 181e12, 90.5e12),
    Peak("4090", 165e12, 82.6e12),
    Peak("A10", 125e12, 31.2e12),
    Peak("L4", 121e12, 30.3e12),
    Peak("V100", 125e12, 15.7e12),
    Peak("3090", 71e12, 35.6e12),
    Peak("T4", 65e12, 8.1e12),
)


def forward_flops_per_token(config: GPTConfig, context: int | None = None) -> int:
    """``2·N + 2·L·T·d`` at context ``T`` (default ``block_size``)."""
    T = config.block_size if context is None else context
    return 2 * matmul_params(config) + 2 * config.n_layer * T * config.n_embd


def training_flops_per_token(config: GPTConfig, context: int | None = None) -> int:
    """``3·(2·N + 2·L·T·d)``: forward and backward of one token."""
    return 3 * forward_flops_per_token(config, context)


def compute_figures(config: GPTConfig, context: int, batch: int) -> list[Figure]:
    """The "Compute per token" section of ``gptlab size``."""
    N, L, T, d = matmul_params(config), config.n_layer, context, config.n_embd
    fwd = forward_flops_per_token(config, context)
    return [
        Figure(
            "N (multiplied weights)",
            N,
            "params",
            "blocks + norms + V·d (head)",
            note="the embedding lookup and position table cost no FLOPs; MoE counts k experts",
        ),
        Figure(
            "forward",
            fwd,
            "FLOPs",
            "2·N + 2·L·T·d",
            f"2·{N} + 2·{L}·{T}·{d}",
            "per token at context T; 2·L·T·d is Q·Kᵀ and A·V averaged over causal positions",
        ),
        Figure("training", 3 * fwd, "FLOPs", "3·forward", f"3·{fwd}", "backward ≈ 2× forward"),
        Figure(
            "training step",
            3 * fwd * batch * T,
            "FLOPs",
            "3·forward·B·T",
            f"3·{fwd}·{batch}·{T}",
            "one optimizer step over B sequences of T tokens",
        ),
    ]


def device_peak(device_name: str, dtype: str) -> tuple[str, float] | None:
    """``(card, FLOP/s)`` for a CUDA device name and a training dtype; None for an unknown card."""
    peak = next((p for p in PEAKS if p.name in device_name), None)
    if peak is None:
        return None
    return peak.name, peak.fp32 if dtype == "float32" else peak.bf16


def peak_flops(device: str, dtype: str) -> tuple[str, float] | None:
    """The peak of ``device`` (``cuda``, ``cuda:1``; None on a CPU or an unlisted card) for ``dtype``."""
    if not device.startswith("cuda"):
        return None
    import torch

    return device_peak(torch.cuda.get_device_name(torch.device(device)), dtype)


def mfu(flops_per_token: float, tokens_per_s: float, peak: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: the share of the devices' peak that the model's FLOPs use."""
    return flops_per_token * tokens_per_s / (peak * devices)
