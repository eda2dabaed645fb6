"""A run's device, precision, attention path and compile choice, resolved once from the machine
(``gptlab.hardware``).

``resolve(cfg, device, context)`` turns ``dtype``, ``attention`` and ``compile = "auto"`` into
what this machine runs fast, and returns the record written to the run's ``train_config.json`` under
``"resolved"``. ``keep_resolved(cfg, saved)`` makes a resumed run keep that choice, even on a
machine where ``auto`` would now choose otherwise.

``loss_impl(cfg, model_config)`` resolves ``loss_impl = "auto"`` from the shapes: the chunked
head + loss (``gptlab.model.chunked_loss``) once a micro-batch's float32 logits,
``4·B·T·V_pad`` bytes, would reach ``CHUNKED_FROM`` (GPT-2's vocabulary at B·T = 1,334 tokens);
the plain path below that, where the logits are small and one fused kernel is simplest. On a GPU
the threshold is also at least ⅛ of the device's memory: on an H100 the plain path was the faster
at GPT-2's shapes (docs/benchmarks.md#memory-and-fsdp), so memory alone decides for chunking.
An FP8 head (``fp8`` naming ``head``) takes the plain path: its product forms the logits whole.
So does a compiled run on torch < 2.13 (``chunked_compiles_correctly``).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from gptlab import hardware
from gptlab.compiling import can_compile
from gptlab.errors import GptlabError
from gptlab.model.fp8 import check_choice
from gptlab.train.config import TrainConfig

if TYPE_CHECKING:
    from gptlab.model import GPTConfig

AUTO_FIELDS = ("dtype", "attention", "compile", "loss_impl")  # kept as first resolved when a run resumes
CHUNKED_FROM = 256 * 2**20  # bytes of one micro-batch's float32 logits


def resolve(cfg: TrainConfig, device: str, context: int) -> tuple[TrainConfig, dict[str, Any]]:
    """``cfg`` with its ``auto`` fields made concrete for ``device`` and a model of ``context``
    tokens, and the record of the choice."""
    compile_ = cfg.compile
    if compile_ == "auto" and (cfg.strategy == "fsdp" or not can_compile(device.split(":")[0])):
        compile_ = False  # FSDP runs uncompiled here; inductor on a CPU needs a C++ compiler
    plan = hardware.plan(
        device=device, dtype=cfg.dtype, attention=cfg.attention, context=context, compile=compile_
    )
    record = {**plan.to_dict(), "requested": {k: getattr(cfg, k) for k in ("device", *AUTO_FIELDS)}}
    return dataclasses.replace(cfg, dtype=plan.dtype, attention=plan.attention, compile=plan.compile), record


def announce(record: dict[str, Any]) -> None:
    """One line on stderr saying what was chosen; before it, for bf16 asked for explicitly on a CPU
    that only emulates it, one warning line."""
    if record["requested"]["dtype"] == "bfloat16":
        hardware.warn_if_emulated(record["device"], "bfloat16", "dtype=bfloat16")
    fields = {f.name for f in dataclasses.fields(hardware.Plan)}
    plan = hardware.Plan(**{k: v for k, v in record.items() if k in fields})
    sys.stderr.write(f"hardware: {plan.summary()}\n")
    if "context" in record:  # a run from pretrained weights on windows shorter than its context
        T, pretrained = record["context"]["block_size"], record["context"]["pretrained"]
        sys.stderr.write(
            f"context: windows of {T} tokens, shorter than init's {pretrained} (model.block_size=N "
            f"chooses; its checkpoints keep the {pretrained}-token context)\n"
        )


def keep_resolved(cfg: TrainConfig, saved: dict[str, Any] | None) -> TrainConfig:
    """A resumed run: every field still ``auto`` takes the value its first run resolved to, and a run
    from pretrained weights without ``model.block_size`` keeps the windows it started with (the
    default for them, ``gptlab.train.init.WINDOW``, may have changed since: its checkpoints would not
    resume)."""
    resolved = (saved or {}).get("resolved") or {}
    kept: dict[str, Any] = {
        k: resolved[k] for k in AUTO_FIELDS if getattr(cfg, k) == "auto" and k in resolved
    }
    context = ((saved or {}).get("model") or {}).get("block_size")
    if cfg.init and "block_size" not in cfg.model and isinstance(context, int):
        kept["model"] = {**cfg.model, "block_size": context}
    return dataclasses.replace(cfg, **kept) if kept else cfg


def loss_impl(cfg: TrainConfig, model_config: GPTConfig, device_memory: int | None = None) -> str:
    """The head + loss path of this run: ``cfg.loss_impl``, or for ``auto`` the one its shapes call for
    (``device_memory``: a GPU's bytes, which raise the threshold to ⅛ of them)."""
    compiled_ok = not cfg.compile or chunked_compiles_correctly()
    if cfg.loss_impl == "chunked" and not compiled_ok:
        raise GptlabError(
            f"loss_impl=chunked with compile=true needs torch >= 2.13: torch {torch_version()} computed "
            "wrong gradients for it under torch.compile; use loss_impl=plain or compile=false"
        )
    if cfg.loss_impl != "auto":
        return cfg.loss_impl
    if "head" in check_choice(cfg.fp8) or not compiled_ok:
        return "plain"
    logits = 4 * cfg.batch_size * model_config.block_size * model_config.padded_vocab_size
    threshold = max(CHUNKED_FROM, (device_memory or 0) // 8)
    return "chunked" if logits >= threshold else "plain"


def torch_version() -> str:
    import torch

    return torch.__version__


def chunked_compiles_correctly(version: str | None = None) -> bool:
    """torch ≥ 2.13: under ``torch.compile`` torch 2.11 gave the chunked loss's model zero gradients
    for some weights (the MLP's first layer; ``tests/model/test_chunked_loss.py``), 2.13 the eager ones."""
    major, minor = (int(part) for part in (version or torch_version()).split(".")[:2])
    return (major, minor) >= (2, 13)


def device_memory(device: str) -> int | None:
    """A CUDA device's total memory in bytes; None elsewhere (host memory is not the limit there)."""
    import torch

    dev = torch.device(device)
    return torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else None
