"""A decode step as one compiled graph (CPU, one sequence): ``compile_decode(model)``.

A decode step of gpt2 runs ~300 small operations: 48 one-row matrix products and, around
them, norms, views, the cache write and read, attention and residual adds. Run one by one,
the Python and dispatch between them cost about as much as the products
(docs/benchmarks.md#decoding). ``decode_step`` is that whole step,

    write k_t, v_t at cache index t = end − 1;   attend over K, V[0, end);   logits_t

written over plain tensors (the session's cache rows) and an ``end`` that ``torch.compile``
treats as a symbol, so one graph serves every length and nothing recompiles as the cache
fills. Inside it each ``InferenceLinear`` inlines its ``gemv`` and inductor fuses the step
into a dozen kernels per layer.

``compile_decode(model)`` asks for it; ``gptlab sample`` and ``gptlab chat`` decide with
``decode_compile_pays`` (``--compile auto``, the default: on where it pays, see below).
From then on ``BatchSession.step`` uses it for a session of one row on a CPU with a C++ compiler
and a float KV cache; ``GPTLAB_COMPILE=0`` turns it off. Its logits equal the layer-by-layer
path's (tested). The first step compiles, for tens of seconds on a cold inductor cache and less
once inductor has it on disk (docs/benchmarks.md#decoding), so it pays for long generations,
repeated sampling and serving, not for one short sample. Every later step, in any session of the model, reuses the graph.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from gptlab.compiling import Compiled
from gptlab.errors import GptlabError
from gptlab.model.kvcache import KVStore

# Inductor inlines a cheap elementwise producer into each consumer. In front of a one-row
# product that would recompute a norm's output once per output channel (50,257 times for the
# head); realising every producer of more than a few operations computes it once.
_OPTIONS = {"realize_opcount_threshold": 10}


class _StepLayer:
    """One layer's cache for the step: write at ``end − 1``, read ``[0, end)``."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, end: int) -> None:
        self.k, self.v, self.end = k, v, end

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k[:, :, self.end - 1 : self.end] = k.to(self.k.dtype)
        self.v[:, :, self.end - 1 : self.end] = v.to(self.v.dtype)
        return self.k[:, :, : self.end], self.v[:, :, : self.end]


class _StepCache:
    """What ``GPT.run`` calls ``cache``: one ``_StepLayer`` per layer."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], end: int) -> None:
        self.layers = [_StepLayer(k, v, end) for k, v in zip(keys, values, strict=True)]


def decode_step(
    model: nn.Module,
    idx: torch.Tensor,  # (1, 1) the new token
    pos: torch.Tensor,  # (1,) its position
    keys: list[torch.Tensor],  # per layer (1, H_kv, T_max, d_k)
    values: list[torch.Tensor],
    end: int,  # cached positions after this step
) -> torch.Tensor:
    """Next-token logits (1, vocab) float32 after appending ``idx`` at cache index ``end − 1``."""
    out = model.run(idx, pos=pos, cache=_StepCache(keys, values, end), last_only=True)
    return out.logits[:, -1].float()


# Below this many generated tokens a compilation costs more than the compiled step saves
# (docs/benchmarks.md#decoding).
PAYBACK_TOKENS = 1024
# On CUDA the static path's CUDA graphs: a compilation of tens of seconds, paid back only by a long
# generation (docs/benchmarks.md#gpu).
CUDA_PAYBACK_TOKENS = 8192
COMPILE_CHOICES = ("auto", "on", "off")


def decode_compile_pays(
    requested: str,
    device_type: str,
    compiler: bool,
    weight_bytes: int,
    planned_tokens: int | None,
) -> tuple[bool, str]:
    """Whether to compile the one-sequence decode step here, and why (a pure function of its inputs).

    ``on``/``off`` are obeyed (``on`` without a C++ compiler on a CPU runs layer by layer, with the
    reason). ``auto`` compiles on a CPU that has a C++ compiler, for a model whose matrices stream
    from memory (``weight_bytes ≥ STREAM_MIN_BYTES``: small models' steps are not bound by
    overhead the graph removes), and when enough tokens are planned to pay the compilation back
    (``planned_tokens`` None: a long-lived session such as chat). (bf16 weights on a CPU that only
    emulates bf16 compute in float32, which compiles well: docs/benchmarks.md#decoding.) CUDA has its
    own static path: there the question is whether to capture its CUDA graphs, which ``auto`` does
    for a long-lived session or from ``CUDA_PAYBACK_TOKENS`` planned tokens (else the dynamic path,
    layer by layer). Other devices run layer by layer.
    """
    from gptlab.generate.quantization import STREAM_MIN_BYTES

    if requested not in COMPILE_CHOICES:
        raise GptlabError(f"--compile must be one of {', '.join(COMPILE_CHOICES)}, got {requested!r}")
    if requested == "off":
        return False, "--compile off"
    if device_type == "cuda":
        if requested == "on" or planned_tokens is None:
            return True, "CUDA graphs of the static decode step" + (
                "" if requested == "on" else " (a long session)"
            )
        if planned_tokens < CUDA_PAYBACK_TOKENS:
            return False, (
                f"{planned_tokens} tokens do not pay back compiling CUDA graphs "
                f"(≈ 50 s on an H100; from {CUDA_PAYBACK_TOKENS})"
            )
        return True, "a long generation: CUDA graphs of the static decode step pay back their compilation"
    if device_type != "cpu":
        return False, f"the compiled CPU step does not apply on {device_type}"
    if not compiler:
        return False, "no C++ compiler for torch.compile (install g++ or set CXX)"
    if requested == "on":
        return True, "--compile on"
    if weight_bytes < STREAM_MIN_BYTES:
        return False, f"a small model ({weight_bytes / 2**20:.0f} MiB of matrices): nothing to gain"
    if planned_tokens is not None and planned_tokens < PAYBACK_TOKENS:
        return False, f"{planned_tokens} tokens do not pay back a compilation (from {PAYBACK_TOKENS})"
    return True, "a large model and a long generation: the compiled step pays back its compilation"


def matrix_bytes(model: nn.Module) -> int:
    """Bytes of the model's 2-D weights in their stored format (what a decode step streams from memory).

    Parameters and buffers (quantized weights are buffers), tied tensors counted once, oneDNN's
    prepacked copies left out.
    """
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    seen: dict[int, int] = {}
    for name, t in tensors.items():
        if t is not None and t.dim() == 2 and not name.endswith("packed"):
            seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


_STEPS: weakref.WeakKeyDictionary[nn.Module, Compiled] = weakref.WeakKeyDictionary()


def compile_decode(model: nn.Module) -> nn.Module:
    """Run ``model``'s one-sequence decode steps on a CPU as one compiled graph; returns ``model``.

    Compilation happens at the first step. Prepare the weights first (``gptlab.quantize``): the
    graph inlines each ``InferenceLinear``'s one-row product.
    """
    if model not in _STEPS:
        _STEPS[model] = Compiled(decode_step, "the compiled decode step", dynamic=True, options=_OPTIONS)
    return model


def fused_step(model: nn.Module, stores: list[KVStore]) -> Compiled | None:
    """The model's compiled ``decode_step`` if ``compile_decode`` asked for it and it can run here."""
    step = _STEPS.get(model)
    if step is None or not step.enabled or model.device.type != "cpu":
        return None
    if any(type(s) is not KVStore for s in stores):  # an int8 cache dequantises on reads: layer by layer
        return None
    return step
