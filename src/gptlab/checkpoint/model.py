"""One checkpoint directory: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``).

An int8 model (``gptlab.quantize(model, "int8")``) is saved as it is held: each matrix as int8
``q`` (out, in) plus ``scales`` (out,), the token table as int8 rows plus one scale per row (a tied
head is stored once, as the table), the rest as floats; ``config.json`` says
``"quantization": {"format": "int8", ...}`` and ``load`` rebuilds the int8 modules from it without
ever making float32 weights. An int4 model is saved the same way (``INT4_FORMAT``: nibbles in a
portable order plus bf16 scales and zeros; packed for this CPU's kernel when loaded).
``load(..., quantize="int8" | "int4" | "bf16")`` of a float checkpoint converts
each tensor as it is read (``gptlab.model.load_quantized``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gptlab.checkpoint import lora
from gptlab.checkpoint.files import (
    CONFIG_FILE,
    FORMAT_VERSION,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    read_json,
    read_tensors,
    read_tensors_lazily,
    require_consolidated,
    resolve_checkpoint,
    write_config,
    write_tensors,
)
from gptlab.checkpoint.integrity import verify_checksums, write_checksums
from gptlab.errors import GptlabError
from gptlab.model import GPT, GPTConfig, build_empty, load_quantized, weight_formats
from gptlab.model.int4 import Int4Embedding, Int4Linear
from gptlab.model.lora import is_lora_model
from gptlab.model.state_dict import load_model_state, model_state

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

#: What config.json says about an int8 checkpoint.
INT8_FORMAT = {
    "format": "int8",
    "scheme": "symmetric; one scale per output channel of each matrix and per row of the token table",
}
#: What config.json says about an int4 checkpoint.
INT4_FORMAT = {
    "format": "int4",
    "scheme": "w = (q - 8)*s + z in groups of 32 inputs: weight = q as nibbles (input 2j low, 2j+1 high), "
    "scales_and_zeros (K/32, N, 2) bf16; matrices without scales_and_zeros int8; the token table int8, "
    "or int4 where wte.zeros is saved: wte.weight nibbles (V, d/2), wte.scales and wte.zeros (V, d/32) bf16; "
    "twice as wide for an int8 table in blocks of 32 as two planes, q = 16*(h - 8) + l, h's d inputs first; "
    "a matrix whose nibbles are twice its inputs holds int8 blocks of 32 as two planes the same way",
}
FORMATS = {"int8": INT8_FORMAT, "int4": INT4_FORMAT}


def read_config(path: str | os.PathLike[str]) -> GPTConfig:
    data = read_json(path)
    if not isinstance(data, dict) or "model" not in data or "gptlab_format" not in data:
        raise GptlabError(
            f"{path}: not a gptlab config.json (for a Hugging Face model use `gptlab convert --from-hf`)"
        )
    if data["gptlab_format"] != FORMAT_VERSION:
        raise GptlabError(
            f"{path}: checkpoint format {data['gptlab_format']} is not supported "
            f"(this gptlab reads format {FORMAT_VERSION})"
        )
    try:
        return GPTConfig.from_dict(data["model"])
    except GptlabError as exc:
        raise GptlabError(f"{path}: {exc}") from None


def context_extra(model: GPT) -> dict[str, int]:
    """``{"context": N}`` for a model fine-tuned on windows shorter than its pretrained context ``N``
    (``model.block_size=256`` on SmolLM2's 8,192; positions computed, not looked up): written beside
    the config as trained, so the checkpoint still runs at the full context (``usable_config``)."""
    context = getattr(model, "pretrained_context", None)
    return {"context": int(context)} if context and context > model.config.block_size else {}


def usable_config(path: str | os.PathLike[str]) -> GPTConfig:
    """The config to run a checkpoint with: as trained (``read_config``), at its pretrained context
    where it was fine-tuned on shorter windows (``context_extra``)."""
    config = read_config(path)
    context = read_json(path).get("context")
    return (
        config.replace(block_size=context)
        if isinstance(context, int) and context > config.block_size
        else config
    )


def save(model: GPT, tokenizer: Tokenizer | None, directory: str | os.PathLike[str]) -> Path:
    """Write ``model`` (and ``tokenizer``, if given) as a checkpoint directory, then the SHA-256 of its
    files (``checksums.json``, ``gptlab.checkpoint.integrity``). An I/O error (a full disk, a quota, a
    permission) is a ``GptlabError``; each file is written atomically, so none is left half-written."""
    directory = Path(directory)
    try:
        write_files(model, tokenizer, directory)
        write_checksums(directory, (WEIGHTS_FILE, lora.ADAPTERS_FILE, CONFIG_FILE, TOKENIZER_FILE))
    except OSError as exc:
        raise write_error(exc, directory) from None
    return directory


def write_error(exc: OSError, where: str | os.PathLike[str]) -> GptlabError:
    """One line for an I/O error while writing (``No space left on device``, ``File too large`` …)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return GptlabError(f"cannot write {where}: {reason}")


def write_files(model: GPT, tokenizer: Tokenizer | None, directory: str | os.PathLike[str]) -> None:
    """The files of a checkpoint (weights or LoRA adapters, config, tokenizer) without checksums; an I/O
    error is raised as the ``OSError`` it is (``save`` and the training checkpoints turn it into one line)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise GptlabError(f"{directory}: exists and is not a directory")
    if is_lora_model(model):  # a LoRA run's checkpoints hold only the adapters
        lora.save_adapters(model, tokenizer, directory)
        return
    fmt = getattr(model, "quantization", None)
    if fmt == "bf16":
        raise GptlabError(
            "a model quantized to bf16 for inference cannot be saved; save it before quantize(), "
            "or store bf16 weights with model.to(torch.bfloat16) / gptlab convert --dtype bf16"
        )
    if fmt == "int8" and any(isinstance(m, Int4Linear | Int4Embedding) for m in model.modules()):
        fmt = "int4"  # int8 blocks held as two int4 planes: stored in the int4 layout, which holds them
    extra: dict[str, Any] = {"quantization": FORMATS[fmt]} if fmt in FORMATS else {}
    extra.update(context_extra(model))
    directory.mkdir(parents=True, exist_ok=True)
    write_tensors(
        directory / WEIGHTS_FILE,
        model_state(model),
        metadata={"format": "pt", "gptlab_format": "1", **({"quantization": fmt} if fmt in FORMATS else {})},
    )
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER_FILE)
    write_config(directory / CONFIG_FILE, model.config, **extra)


def stored_format(path: str | os.PathLike[str]) -> str | None:
    """``"int8"`` or ``"int4"`` for a checkpoint saved so, else None (float weights)."""
    directory = resolve_checkpoint(path)
    config = directory / CONFIG_FILE
    data = read_json(config) if config.is_file() else {}
    quant = data.get("quantization") if isinstance(data, dict) else None
    if quant is None:
        return None
    if not isinstance(quant, dict) or quant.get("format") not in FORMATS:
        raise GptlabError(
            f"{config}: unknown quantization {quant!r}; this gptlab reads {' and '.join(FORMATS)} checkpoints"
        )
    return str(quant["format"])


def load(
    path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    quantize: str | None = None,
) -> tuple[GPT, Tokenizer | None]:
    """Read a checkpoint directory (or a run directory: its latest checkpoint) → ``(model, tokenizer_or_None)``.

    ``quantize`` (``"fp32"``, ``"bf16"``, ``"int8"``, ``"int4"``): the model for inference in that format, as
    ``gptlab.quantize`` makes it; on a CPU, bf16 and int8 are converted tensor by tensor while reading.
    An int8 (int4) checkpoint loads as it is stored (``quantize`` None or its format).
    """
    directory = resolve_checkpoint(path)
    verify_checksums(directory)  # a changed byte is refused, naming its file
    require_consolidated(directory)  # FSDP shards: a one-line hint to consolidate first
    if lora.is_lora_checkpoint(directory):  # its base may be any source: gptlab.sources merges it
        raise GptlabError(
            f"{directory}: a LoRA run's checkpoint (adapters and a reference to their base); "
            f"open it with gptlab.load, which merges the adapters into the base"
        )
    stored = stored_format(directory)
    config = usable_config(directory / CONFIG_FILE)
    weights = directory / WEIGHTS_FILE
    cpu = torch.device(device).type == "cpu"
    if stored is not None:
        if quantize not in (None, stored) or dtype is not None or not cpu:
            asked = quantize or (str(dtype).removeprefix("torch.") if dtype is not None else f"on {device}")
            raise GptlabError(
                f"{directory}: holds {stored} weights for the CPU, which cannot be loaded as {asked}; "
                f"use --dtype {stored} (or auto), or convert the float model again"
            )
        loader = load_quantized.load_int4 if stored == "int4" else load_quantized.load_int8
        model = loader(config, read_tensors(weights), weights)
    elif quantize in load_quantized.STREAMED and cpu and dtype is None:
        model = load_quantized.build_quantized(config, read_tensors_lazily(weights), quantize, weights)
    else:  # built (not initialised) and filled on the device itself: the weights never pass through the CPU
        model = build_empty(config, device)
        load_model_state(model, read_tensors(weights, device), weights)
        if dtype is not None:
            model.to(dtype=dtype)
        model.eval()
        if quantize:
            weight_formats.quantize(model, quantize)
    tokenizer = load_tokenizer(directory)
    check_tokenizer_fits(tokenizer, config.vocab_size, directory / TOKENIZER_FILE)
    return model, tokenizer


def check_tokenizer_fits(
    tokenizer: Tokenizer | None, vocab_size: int, source: str | os.PathLike[str]
) -> None:
    """Refuse a tokenizer that makes ids past the model's embedding table (its output would be garbage)."""
    if tokenizer is not None and tokenizer.vocab_size > vocab_size:
        raise GptlabError(
            f"{source}: the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary is "
            f"{vocab_size}; use the tokenizer the model was trained with"
        )


def restore_weights(model: GPT, directory: str | os.PathLike[str]) -> None:
    """Resume: copy a training checkpoint's weights (or, for a LoRA run, its adapters) into ``model``."""
    directory = Path(directory)
    if lora.is_lora_checkpoint(directory):
        lora.load_adapters(model, directory)
    else:
        load_model_state(model, read_tensors(directory / WEIGHTS_FILE), directory)


def load_tokenizer(directory: str | os.PathLike[str]) -> Tokenizer | None:
    path = Path(directory) / TOKENIZER_FILE
    if not path.exists():
        return None
    from gptlab import tokenizers

    return tokenizers.load(path)
