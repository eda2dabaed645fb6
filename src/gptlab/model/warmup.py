"""Paying a decode's first-call set-up while the model loads, not at its first token.

A model large enough to stream its weights (``gptlab.model.quantized``: ``InferenceLinear.streams``, set
where ``gptlab.hardware.one_row_kernel`` says ``compiled``: below native bf16; elsewhere nothing here
runs) multiplies one row on a CPU through a compiled kernel (``gemv``), which is compiled on its first
call: from inductor's cache that still means importing torch's compiler and tracing the kernel,
seconds that the first prefill used to pay (its last row goes through the head's one-row product)
and the second did not. Dynamo compiles the kernel twice, once for a row at the start of its
tensor (a decode step) and once for a row further in (a prefill's last position), and
``dynamic=True`` makes each graph serve every matrix shape; so calling one streaming layer of each
kind (weight dtype, with or without bias and scales) both ways compiles everything a decode uses.

    warm_up(model)   # after a load: the one-row kernels, compiled (or read from the cache)

torch's compiler is imported by the warm-up itself, only for a model that streams: importing it on
another thread while the weights were read overlapped nothing (the import holds the interpreter lock,
and reading a kept checkpoint's tensors slowed from ~0.1 s to 1.2–1.5 s beside it), and it was
started from the file's size, so a model that turned out to have no streaming layer (SmolLM2's file
kept as int4) paid ~2 s and 116 MB for a compiler it never used.

The warm-up runs zeros through the layers and returns nothing; the outputs, and so every generated
token, are those of the kernels a decode would have compiled anyway.
"""

from __future__ import annotations

import torch
from torch import nn

from gptlab.model.quantized import InferenceLinear


def streaming_layers(model: nn.Module) -> list[InferenceLinear]:
    """One CPU layer of each kind that multiplies one row through the compiled kernel: a kind is what
    dynamo guards on besides shapes (the weight's dtype and dispatch keys: a tied head's weight, made
    from the token table, carries other keys than the other matrices; a bias; int8 scales)."""
    kinds: dict[tuple[torch.dtype, str, bool, bool], InferenceLinear] = {}
    for module in model.modules():
        if isinstance(module, InferenceLinear) and module.streams and module.weight.device.type == "cpu":
            keys = str(torch._C._dispatch_keys(module.weight))
            kinds.setdefault((module.weight.dtype, keys, module.bias is None, module.scales is None), module)
    return list(kinds.values())


@torch.inference_mode()
def warm_up(model: nn.Module) -> int:
    """Compile (or read from the cache) every one-row kernel ``model``'s decode will call; the number of
    layer kinds warmed (0 for a model that does not stream: nothing to pay). Under inference mode, as
    a decode runs (``gptlab.generate.session``): dynamo guards on the weight's dispatch keys, which
    inference mode changes."""
    layers = streaming_layers(model)
    act = activation_dtype_of(model)
    for layer in layers:
        k = layer.in_features
        layer(torch.zeros(1, k, dtype=act))  # a decode step: the row starts its tensor
        layer(torch.zeros(3, k, dtype=act)[2:])  # a prefill's last position: a row further in
    return len(layers)


def activation_dtype_of(model: nn.Module) -> torch.dtype:
    """The dtype a decode's rows reach the matrices in: the model's own (``GPT.dtype``, its token table's
    output), else the first floating parameter's. Dynamo guards on it, so a warm-up in another dtype
    would compile kernels the decode never calls (int4 models compute in bf16 where bf16 is native)."""
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    floats = (p.dtype for p in model.parameters() if p.is_floating_point())
    return next(floats, torch.float32)
