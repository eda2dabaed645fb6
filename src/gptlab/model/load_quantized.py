"""Quantizing while loading: weights arrive one tensor at a time and are stored in their inference
format as they arrive, so a whole float32 model never exists in memory.

    model = build_quantized(config, tensors, "int8")   # tensors: gptlab name → float tensor, on demand
    model = load_int8(config, state, source)           # an int8 checkpoint: int8 weights + scales as stored
    model = build_quantized(config, tensors, "int4", source, int4=parts)  # GGUF Q4 blocks kept as they are
    model = load_int4(config, state, source)           # an int4 checkpoint: nibbles + scales and zeros

The model is built on the meta device (shapes, no memory); its computed buffers (RoPE tables,
sinusoids, ALiBi slopes) are made on the CPU; then each ``nn.Linear`` in turn gets its float weight,
which ``gptlab.quantize``'s own converter for the format turns into ``Int8Linear`` (``q = round(W/s)``,
``s_o = max_k |W_ok|/127``) or a bf16 linear before the next one is read. The small rest (norms,
the token table) follows, and ``quantize(model, mode)`` finishes exactly as it does in memory (the
tied head and the int8 token table), so the weights equal ``quantize(load(...), mode)``'s. Peak memory
is the quantized model plus the largest float tensor, instead of the float32 model plus its copy.

int4 (``"int4"``): each matrix whose ``Int4Parts`` are given (a GGUF file's Q4_0/Q4_1 blocks, or its
Q8_0 blocks as two int4 planes) is built from them without a float copy; a matrix in ``int8`` (the GGUF loader's choice for its other
tensor types) becomes ``Int8Linear``; any other becomes int4 from its float weight (``quantize_int4``);
the output head and the token table are int8, but a token table given as ``Int4Parts`` (a GGUF file's
4-bit table, or its Q8_0 one as two int4 planes) is kept int4 (``Int4Embedding``) and a tied head
multiplies it through the int4 kernel. Such a model is named by what it holds (``held_format``): int4,
or int8 where none of its weights has 4 bits (a Q8_0 file's matrices all kept as planes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping

import torch
from torch import nn

from gptlab.errors import GptlabError
from gptlab.hardware import map_large_blocks, release_memory
from gptlab.model import GPT, GPTConfig, build_empty
from gptlab.model.int4 import Int4Embedding, Int4Linear, Int4Parts, held_format
from gptlab.model.quantized import (
    InferenceLinear,
    Int8Embedding,
    Int8Linear,
    activation_dtype,
)
from gptlab.model.state_dict import check_state, load_model_state, model_state, pad_vocab
from gptlab.model.weight_formats import QUANTIZERS, mark_streaming, quantize

#: Formats built while loading (fp32 needs no conversion: it loads as it is stored).
STREAMED = ("bf16", "int8", "int4")


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
    config: GPTConfig,
    tensors: Mapping[str, torch.Tensor],
    mode: str,
    source: str | os.PathLike[str],
    int4: Mapping[str, Callable[[], Int4Parts]] | None = None,
    int8: Collection[str] = (),
    table: Callable[[], tuple[torch.Tensor, torch.Tensor] | Int4Parts] | None = None,
) -> GPT:
    """A ``GPT`` in ``mode`` (``"bf16"``, ``"int8"``, ``"int4"``) from float tensors under gptlab names, read
    one at a time. ``int4`` (mode int4): linear path → its parts, read instead of its float weight;
    ``int8``: linear paths made int8 in an int4 model; ``table`` (int8 and int4): the token table as
    int8 rows (V, d) and their scales (V,), or (mode int4) as ``Int4Parts``, made without its float
    copy (a tied head shares them)."""
    if mode not in STREAMED:
        raise GptlabError(f"weights are converted while loading to {' or '.join(STREAMED)}, not {mode!r}")
    map_large_blocks()  # each float weight is freed back to the system, not kept in the heap
    model = _meta_model(config)
    expected = model_state(model)
    check_state(expected, {name: None for name in tensors}, source, shapes=False)

    def take(name: str) -> torch.Tensor:
        one = {name: tensors[name]}
        check_state({name: expected[name]}, one, source)  # its shape
        t = one[name]  # float32 for the quantizers; a bf16 tensor read for bf16 as it is (nothing to cast)
        return pad_vocab(model, {name: t if mode == "bf16" and t.dtype == torch.bfloat16 else t.float()})[
            name
        ]

    tied = config.tie_embeddings
    done: set[str] = set()
    with torch.no_grad():
        paths = [p for p, m in model.named_modules() if isinstance(m, nn.Linear)]  # names only: a list
        for path in paths:  # of the modules would keep every float weight alive until the end
            if tied and path == "lm_head":
                continue  # a tied head is made from the token table by quantize() below
            linear = model.get_submodule(path)
            assert isinstance(linear, nn.Linear)
            parts = (int4 or {}).get(path) if mode == "int4" else None
            for leaf in ("weight", "bias") if parts is None else ("bias",):
                if getattr(linear, leaf) is not None:
                    setattr(linear, leaf, nn.Parameter(take(f"{path}.{leaf}"), requires_grad=False))
                    done.add(f"{path}.{leaf}")
            if parts is not None:
                done.add(f"{path}.weight")
                layer: nn.Module = Int4Linear(linear, parts(), activation_dtype("cpu"))
            elif mode == "int4" and (path in int8 or path == "lm_head"):
                layer = Int8Linear(linear, activation_dtype("cpu"))
            else:
                holder = nn.ModuleDict({"layer": linear})
                QUANTIZERS[mode](holder)  # the float weight is freed once the converted layer holds its copy
                layer = holder["layer"]
                del holder
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent), child, layer)
            del linear, layer
        if table is not None and mode in ("int8", "int4"):
            made = table()
            act = activation_dtype("cpu")
            if isinstance(made, Int4Parts):
                if mode != "int4":
                    raise GptlabError(f"an int4 token table in a model loaded as {mode}")
                p = pad_vocab(
                    model, {"wte.weight": made.q, "wte.scales": made.scales, "wte.zeros": made.zeros}
                )
                padded = Int4Parts(p["wte.weight"], p["wte.scales"], p["wte.zeros"], made.planes)
                four = Int4Embedding.from_parts(padded, act)
                model.wte = four  # type: ignore[assignment]
                if tied:  # the head multiplies the table's own int4 bytes
                    model.lm_head = four.head()  # type: ignore[assignment]
            else:
                rows = pad_vocab(model, {"wte.weight": made[0], "wte.scales": made[1].float()})
                embedding = Int8Embedding(rows["wte.weight"], rows["wte.scales"].to(act))
                model.wte = embedding  # type: ignore[assignment]
                if tied:  # the head is the table's int8 matrix, stored once
                    head = _stored_int8(model.lm_head, embedding.weight, embedding.scales, act)
                    model.lm_head = head  # type: ignore[assignment]
            done.add("wte.weight")
        for name in expected:
            if name not in done:
                parent, _, leaf = name.rpartition(".")
                module = model.get_submodule(parent)
                if leaf in module._parameters:
                    module._parameters[leaf] = nn.Parameter(take(name), requires_grad=False)
                else:
                    module._buffers[leaf] = take(name)
        if tied and table is None:
            model.lm_head.weight = model.wte.weight
    quantize(model, mode)  # the tied head, the int8 token table, the norms' dtype; then malloc_trim
    if mode == "int4":
        model.quantization = held_format(model)  # type: ignore[assignment]  # int8 if no 4-bit weight
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


def load_int4(config: GPTConfig, state: Mapping[str, torch.Tensor], source: str | os.PathLike[str]) -> GPT:
    """A model saved in int4 (``gptlab.save`` of an int4 model): each matrix as stored (int4 where
    ``scales_and_zeros`` is saved with it, else int8), the token table int8 (or int4 where ``wte.zeros``
    is saved: a GGUF file's 4-bit table), the rest in the activations' dtype; the int4 nibbles are
    packed into this CPU's kernel layout as they are read."""
    map_large_blocks()
    model = _meta_model(config)
    act = activation_dtype("cpu")
    # copies (see load_int8): the kernels' vector loads want fresh, aligned tensors
    loaded = pad_vocab(model, {k: v.to(copy=True) for k, v in state.items()})
    used: set[str] = set()

    def get(name: str) -> torch.Tensor:
        if name not in loaded:
            raise GptlabError(f"{source}: no tensor {name}")
        used.add(name)
        return loaded[name]

    def optional(name: str) -> torch.Tensor | None:
        return get(name).to(act) if name in loaded else None

    with torch.no_grad():
        paths = [p for p, m in model.named_modules() if isinstance(m, nn.Linear)]
        for path in paths:
            if config.tie_embeddings and path == "lm_head":
                continue
            if f"{path}.scales_and_zeros" in loaded:
                nibbles = get(f"{path}.weight")
                linear = model.get_submodule(path)
                assert isinstance(linear, nn.Linear)
                planes = nibbles.size(1) * 2 // linear.in_features  # 2: int8 blocks as two planes
                layer: nn.Module = Int4Linear.stored(
                    nibbles, get(f"{path}.scales_and_zeros"), optional(f"{path}.bias"), act, planes
                )
            else:
                layer = _stored_int8(
                    model.get_submodule(path), get(f"{path}.weight"), get(f"{path}.scales"), act
                )
                bias = optional(f"{path}.bias")
                layer.register_buffer("bias", bias)
            parent, _, child = path.rpartition(".")
            setattr(model.get_submodule(parent), child, layer)
        if "wte.zeros" in loaded:
            nibbles = get("wte.weight")
            planes = nibbles.size(1) * 2 // config.n_embd  # 2: a Q8_0 table's two planes
            four = Int4Embedding.stored(nibbles, get("wte.scales"), get("wte.zeros"), act, planes)
            model.wte = four  # type: ignore[assignment]
            if config.tie_embeddings:
                model.lm_head = four.head()  # type: ignore[assignment]
        else:
            table = Int8Embedding(get("wte.weight"), get("wte.scales").to(act))
            model.wte = table  # type: ignore[assignment]
            if config.tie_embeddings:
                model.lm_head = _stored_int8(model.lm_head, table.weight, table.scales, act)  # type: ignore[assignment]
        for name in (k for k in loaded if k not in used):  # norms (and any other small tensor)
            parent, _, leaf = name.rpartition(".")
            try:
                module = model.get_submodule(parent)
            except AttributeError:
                raise GptlabError(f"{source}: unexpected tensor {name}") from None
            value = loaded[name].to(act) if loaded[name].is_floating_point() else loaded[name]
            if leaf in module._parameters:
                module._parameters[leaf] = nn.Parameter(value, requires_grad=False)
            elif leaf in module._buffers:
                module._buffers[leaf] = value
            else:
                raise GptlabError(f"{source}: unexpected tensor {name}")
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise GptlabError(f"{source}: no weights for {', '.join(left[:5])}")
    mark_streaming(model)  # as a conversion at load decides it
    model.quantization = held_format(model)  # type: ignore[assignment]
    release_memory()
    return model.eval()


def _stored_int8(linear: nn.Module, q: torch.Tensor, scales: torch.Tensor, act: torch.dtype) -> Int8Linear:
    """An ``Int8Linear`` holding a checkpoint's int8 ``q`` (N, K) and per-channel ``scales`` as they are."""
    layer = Int8Linear.__new__(Int8Linear)
    InferenceLinear.__init__(layer, linear)  # type: ignore[arg-type]
    layer.register_buffer("weight", q)
    layer.scales = scales.to(act)
    layer.register_buffer("bias", None)
    return layer
