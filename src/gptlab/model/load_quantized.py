"""Quantizing while loading: weights arrive one tensor at a time and are stored in their inference
format as they arrive, so a whole float32 model never exists in memory.

    model = build_quantized(config, tensors, "int8")   # tensors: gptlab name → float tensor, on demand
    model = load_int8(config, state, source)           # an int8 checkpoint: int8 weights + scales as stored

The model is built on the meta device (shapes, no memory); its computed buffers (RoPE tables,
sinusoids, ALiBi slopes) are made on the CPU; then each ``nn.Linear`` in turn gets its float weight,
which ``gptlab.quantize``'s own converter for the format turns into ``Int8Linear`` (``q = round(W/s)``,
``s_o = max_k |W_ok|/127``) or a bf16 linear before the next one is read. The small rest (norms,
the token table) follows, and ``quantize(model, mode)`` finishes exactly as it does in memory (the
tied head and the int8 token table), so the weights equal ``quantize(load(...), mode)``'s. Peak memory
is the quantized model plus the largest float tensor, instead of the float32 model plus its copy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from torch import nn

from gptlab.errors import GptlabError
from gptlab.model import GPT, GPTConfig, build_empty
from gptlab.model.quantized import (
    QUANTIZERS,
    activation_dtype,
    map_large_blocks,
    quantize,
    release_memory,
)
from gptlab.model.state_dict import check_state, load_model_state, model_state, pad_vocab

#: Formats built while loading (fp32 needs no conversion: it loads as it is stored).
STREAMED = ("bf16", "int8")


def _meta_model(config: GPTConfig) -> GPT:
    """``build_model(config)`` with every weight on the meta device and the computed buffers on the CPU."""
    model = build_empty(config, "meta")
    for module in model.modules():
        names = [n for n, b in module._buffers.items() if b is not None and b.is_meta]
        if names:  # positional modules: built from the config alone
            fresh = type(module)(config)
            for n in names:
                module._buffers[n] = fresh._buffers[n]
    return model


def build_quantized(
    config: GPTConfig, tensors: Mapping[str, torch.Tensor], mode: str, source: str | os.PathLike[str]
) -> GPT:
    """A ``GPT`` in ``mode`` (``"bf16"``, ``"int8"``) from float tensors under gptlab names, read one at a time."""
    if mode not in STREAMED:
        raise GptlabError(f"weights are converted while loading to {' or '.join(STREAMED)}, not {mode!r}")
    map_large_blocks()  # each float weight is freed back to the system, not kept in the heap
    model = _meta_model(config)
    expected = model_state(model)
    check_state(expected, {name: None for name in tensors}, source, shapes=False)

    def take(name: str) -> torch.Tensor:
        one = {name: tensors[name]}
        check_state({name: expected[name]}, one, source)  # its shape
        return pad_vocab(model, {name: one[name].float()})[name]

    tied = config.tie_embeddings
    done: set[str] = set()
    with torch.no_grad():
        paths = [p for p, m in model.named_modules() if isinstance(m, nn.Linear)]  # names only: a list
        for path in paths:  # of the modules would keep every float weight alive until the end
            if tied and path == "lm_head":
                continue  # a tied head is made from the token table by quantize() below
            linear = model.get_submodule(path)
            for leaf in ("weight", "bias"):
                if getattr(linear, leaf) is not None:
                    setattr(linear, leaf, nn.Parameter(take(f"{path}.{leaf}"), requires_grad=False))
                    done.add(f"{path}.{leaf}")
            holder = nn.ModuleDict({"layer": linear})
            QUANTIZERS[mode](holder)  # the float weight is freed once the converted layer holds its copy
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent), child, holder["layer"])
            del linear, holder
        for name in expected:
            if name not in done:
                parent, _, leaf = name.rpartition(".")
                module = model.get_submodule(parent)
                if leaf in module._parameters:
                    module._parameters[leaf] = nn.Parameter(take(name), requires_grad=False)
                else:
                    module._buffers[leaf] = take(name)
        if tied:
            model.lm_head.weight = model.wte.weight
    quantize(model, mode)  # the tied head, the int8 token table, the norms' dtype; then malloc_trim
    return model


def load_int8(config: GPTConfig, state: Mapping[str, torch.Tensor], source: str | os.PathLike[str]) -> GPT:
    """A model saved in int8 (``gptlab.save`` of an int8 model): its int8 weights and scales as stored."""
    map_large_blocks()
    model = _meta_model(config)
    quantize(model, "int8")  # the int8 modules, on the meta device
    act = activation_dtype("cpu")
    # copies, not views into the file's memory map: a tensor there starts wherever the file puts it, and
    # the fused int8 kernel's AVX-512 path faults on rows that are not 64-byte aligned (a fresh tensor is)
    loaded = {k: v.to(act if v.is_floating_point() else v.dtype, copy=True) for k, v in state.items()}
    with torch.no_grad():
        load_model_state(model, loaded, source, assign=True)
        if config.tie_embeddings:  # stored once, as the token table
            model.lm_head.weight, model.lm_head.scales = model.wte.weight, model.wte.scales
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise GptlabError(f"{source}: no weights for {', '.join(left[:5])}")
    release_memory()
    return model.eval()
