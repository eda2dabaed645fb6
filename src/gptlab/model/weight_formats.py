"""Which weight format a model runs in: ``quantize(model, "fp32" | "bf16" | "int8" | "int4")``, the one decider.

Each format is a function chosen by name (``QUANTIZERS``) that replaces the model's ``nn.Linear``
layers with the inference layers of ``gptlab.model.quantized`` (float, packed bf16, int8) or
``gptlab.model.int4`` and casts the rest (embeddings, norms) to the activation dtype; ``quantize``
then marks which layers stream their weights from memory in a decode step through the compiled
one-row kernel: a model of ``STREAM_MIN_BYTES`` or more of matrices, on a CPU where
``gptlab.hardware.one_row_kernel`` says ``compiled`` (elsewhere the library kernels multiply one row).
"""

from __future__ import annotations

import itertools
from typing import TypeVar

import torch
from torch import nn

from gptlab import hardware
from gptlab.errors import GptlabError
from gptlab.model import quantized
from gptlab.model.int4 import to_int4
from gptlab.model.quantized import (
    FloatLinear,
    InferenceLinear,
    Int8Linear,
    PackedBF16Linear,
    activation_dtype,
    cast_params,
    int8_embedding,
    replace_linears,
)

M = TypeVar("M", bound=nn.Module)


def _to_int8(model: nn.Module) -> None:
    """int8 matrices; activations, embeddings and norms in bf16 where bf16 is native, else float32."""
    act = activation_dtype(next(model.parameters()).device)
    replace_linears(model, lambda linear: Int8Linear(linear, act))
    cast_params(model, act)
    int8_embedding(model, act)


def _to_int4(model: nn.Module) -> None:
    """``gptlab.model.int4.to_int4``: int4 matrices, an int8 head and token table."""
    to_int4(model)


def _to_bf16(model: nn.Module) -> None:
    """bf16 matrices; activations, embeddings and norms in bf16 where bf16 is native, else float32.

    (Where bf16 is emulated, bf16 activations made a compiled decode step slower than layer by
    layer, while bf16 weights alone stream faster than float32 ones: docs/benchmarks.md#decoding.)
    """
    cast_params(model, torch.bfloat16)  # the matrices (a tied head shares the token table's copy)
    replace_linears(model, PackedBF16Linear)
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    act = activation_dtype(first.device if first is not None else "cpu")
    if act != torch.bfloat16:
        cast_params(model, act)


def _to_fp32(model: nn.Module) -> None:
    cast_params(model, torch.float32)
    replace_linears(model, FloatLinear)


QUANTIZERS = {
    "fp32": _to_fp32,
    "bf16": _to_bf16,
    "int8": _to_int8,
    "int4": _to_int4,
}


def mark_streaming(model: nn.Module) -> None:
    """Whether the model's layers multiply a decode step's one row through the compiled kernel
    (``InferenceLinear.streams``): all of them where ``gptlab.hardware.one_row_kernel`` says ``compiled``
    and the matrices are too large for the caches (``STREAM_MIN_BYTES``), else none. Decided here for
    every inference model, converted (``quantize``) or read as stored (an int4 checkpoint)."""
    linears = [m for m in model.modules() if isinstance(m, InferenceLinear)]
    streams = (
        sum(int(m.weight.numel() * m.weight.element_size()) for m in linears) >= quantized.STREAM_MIN_BYTES
        and hardware.one_row_kernel("cpu") == "compiled"
    )
    for m in linears:
        m.streams = streams  # a decode step reads every weight from memory: the one-row kernel pays


@torch.no_grad()
def quantize(model: M, mode: str) -> M:
    """Convert ``model`` in place for inference (``"fp32"``, ``"bf16"``, ``"int8"`` or ``"int4"``) and return it.

    An int8 model can be saved (``gptlab.save``: int8 weights and scales) but not trained; keep the
    float weights for that. The freed float memory is handed back to the system (``release_memory``).
    """
    if mode not in QUANTIZERS:
        raise GptlabError(f"unknown weight format {mode!r}; choose one of {', '.join(QUANTIZERS)}")
    current = getattr(model, "quantization", None)
    if current == mode:
        return model
    if current in ("bf16", "int8", "int4"):
        raise GptlabError(
            f"this model is already {current}; load the float checkpoint again to use another format"
        )
    QUANTIZERS[mode](model)
    mark_streaming(model)
    model.quantization = mode  # type: ignore[assignment]
    hardware.release_memory()
    return model.eval()
