"""FLOPs per token of a ``GPTConfig`` (Kaplan et al. 2020), and the peak of the device it runs on.

    forward   = 2·N + 2·L·T·d      N: the weights a token multiplies (``gptlab.inspect.params``);
                                   2·L·T·d: Q·Kᵀ and A·V, averaged over the causal positions
    training  = 3·forward          the backward costs about twice the forward
    MFU       = training FLOPs per token · tokens/s / (peak FLOP/s · devices)

A query that reads ``T_k`` keys costs ``2·T_k·d`` for ``Q·Kᵀ`` and as much for ``A·V``; the
attention term depends on which keys each query reads, so it is chosen by ``config.arch``:

    decoder          2·N + 2·L·T·d                      causal: T/2 keys on average
    encoder          2·N + 4·L·T·d                      bidirectional: every query reads all T keys
    encoder-decoder  2·N_dec + 2·L·T·d + 4·L·S·d        per target token: causal self-attention,
                     + (S/T)·(2·N_enc + 4·L_enc·S·d)    cross-attention over S source tokens, and the
                                                        encoder's S source tokens shared by T targets

(``N_enc``: the weights a source token multiplies, cross-attention ``W_K, W_V`` included;
``N_dec = N − N_enc``; ``S`` defaults to ``T``.)

This one formula serves ``gptlab size`` and the MFU that ``gptlab train`` shows. The peaks are the
dense (no sparsity) tensor-core figures of each card's datasheet, for 16-bit and for float32 numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from gptlab.inspect.figures import Figure
from gptlab.inspect.params import matmul_params, source_matmul_params
from gptlab.model.config import GPTConfig

Term = tuple[str, Fraction, str, str]  # (formula, FLOPs per token, formula with numbers, what it is)


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


def _decoder_terms(c: GPTConfig, T: int, S: int) -> list[Term]:
    N, L, d = matmul_params(c), c.n_layer, c.n_embd
    return [
        ("2·N", Fraction(2 * N), f"2·{N}", "the weights"),
        ("2·L·T·d", Fraction(2 * L * T * d), f"2·{L}·{T}·{d}", "Q·Kᵀ and A·V averaged over causal positions"),
    ]


def _encoder_terms(c: GPTConfig, T: int, S: int) -> list[Term]:
    N, L, d = matmul_params(c), c.n_layer, c.n_embd
    return [
        ("2·N", Fraction(2 * N), f"2·{N}", "the weights"),
        (
            "4·L·T·d",
            Fraction(4 * L * T * d),
            f"4·{L}·{T}·{d}",
            "Q·Kᵀ and A·V over all T keys (bidirectional)",
        ),
    ]


def _encoder_decoder_terms(c: GPTConfig, T: int, S: int) -> list[Term]:
    N_enc = source_matmul_params(c)
    N_dec, L, E, d = matmul_params(c) - N_enc, c.n_layer, c.n_encoder_layer or 0, c.n_embd
    return [
        ("2·N_dec", Fraction(2 * N_dec), f"2·{N_dec}", "the decoder's weights"),
        ("2·L·T·d", Fraction(2 * L * T * d), f"2·{L}·{T}·{d}", "causal self-attention"),
        ("4·L·S·d", Fraction(4 * L * S * d), f"4·{L}·{S}·{d}", "cross-attention over S source tokens"),
        (
            "(S/T)·(2·N_enc + 4·L_enc·S·d)",
            Fraction(S, T) * (2 * N_enc + 4 * E * S * d),
            f"({S}/{T})·(2·{N_enc} + 4·{E}·{S}·{d})",
            "the encoder's share: S source tokens per T target tokens",
        ),
    ]


#: config.arch → the terms of the forward FLOPs per token (per target token for an encoder–decoder)
FORWARD_TERMS: dict[str, Callable[[GPTConfig, int, int], list[Term]]] = {
    "decoder": _decoder_terms,
    "encoder": _encoder_terms,
    "encoder-decoder": _encoder_decoder_terms,
}


def forward_terms(config: GPTConfig, context: int | None = None, source: int | None = None) -> list[Term]:
    """The forward FLOPs per token as ``(formula, FLOPs, calc, note)`` terms at context ``T``, source ``S``."""
    T = config.block_size if context is None else context
    return FORWARD_TERMS[config.arch](config, T, T if source is None else source)


def forward_flops_per_token(config: GPTConfig, context: int | None = None, source: int | None = None) -> int:
    """``2·N + 2·L·T·d`` at context ``T`` (default ``block_size``) for a decoder; see the module's table."""
    return round(sum(t[1] for t in forward_terms(config, context, source)))


def training_flops_per_token(config: GPTConfig, context: int | None = None, source: int | None = None) -> int:
    """``3·forward``: forward and backward of one token."""
    return 3 * forward_flops_per_token(config, context, source)


def compute_figures(config: GPTConfig, context: int, batch: int, source: int | None = None) -> list[Figure]:
    """The "Compute per token" section of ``gptlab size``."""
    N, T = matmul_params(config), context
    terms = forward_terms(config, context, source)
    fwd = forward_flops_per_token(config, context, source)
    figs = [
        Figure(
            "N (multiplied weights)",
            N,
            "params",
            "blocks + norms + V·d (head)",
            note="the embedding lookup and position table cost no FLOPs; MoE counts k experts",
        )
    ]
    if config.arch == "encoder-decoder":
        N_enc = source_matmul_params(config)
        figs += [
            Figure("N_enc (per source token)", N_enc, "params", "encoder blocks + norm + L·cross W_K, W_V"),
            Figure("N_dec (per target token)", N - N_enc, "params", "N − N_enc"),
        ]
    per = "target token" if config.arch == "encoder-decoder" else "token"
    figs += [
        Figure(
            "forward",
            fwd,
            "FLOPs",
            " + ".join(t[0] for t in terms),
            " + ".join(t[2] for t in terms),
            f"per {per} at context T; " + "; ".join(f"{t[0]} is {t[3]}" for t in terms[1:]),
        ),
        Figure("training", 3 * fwd, "FLOPs", "3·forward", f"3·{fwd}", "backward ≈ 2× forward"),
        Figure(
            "training step",
            3 * fwd * batch * T,
            "FLOPs",
            "3·forward·B·T",
            f"3·{fwd}·{batch}·{T}",
            "one optimizer step over B sequences of T tokens"
            + (" (target tokens, each with its S-token source)" if config.arch == "encoder-decoder" else ""),
        ),
    ]
    return figs


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
