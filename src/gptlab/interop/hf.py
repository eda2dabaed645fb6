"""``from_hf`` / ``to_hf``: Hugging Face transformers model directories ↔ gptlab models, offline.

    model = gptlab.from_hf("path/to/gpt2")          # GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM
    gptlab.to_hf(model, "out/")                      # AutoModelForCausalLM.from_pretrained("out/") loads it

The architecture is chosen by ``model_type`` (import) or by the model's options
(export) from ``FAMILIES``; each family is a config mapping plus a tensor-name
table (``gptlab.interop.gpt2``, ``llama``, ``qwen3``). A model no family computes
exactly is exported as a remote-code folder (``gptlab.interop.hf_remote``): the
model's own code, generated from ``gptlab.model``, beside its weights.
``transformers`` is not imported: only files are read and written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gptlab.checkpoint import load_model_state, model_state, write_tensors
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json
from gptlab.interop import gpt2, hf_remote, llama, qwen3
from gptlab.interop.common import (
    BIN_FILE,
    BIN_INDEX,
    CONFIG_FILE,
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX,
    Family,
    export_state,
    import_lazy,
    import_state,
    normalise_names,
    read_hf_config,
    read_hf_weights,
)
from gptlab.model import GPT, GPTConfig, build_empty
from gptlab.tokenizers.base import Tokenizer

#: Hugging Face ``model_type`` → converter. ``to_hf`` tries them in this order.
FAMILIES: dict[str, Family] = {"gpt2": gpt2.FAMILY, "llama": llama.FAMILY, "qwen3": qwen3.FAMILY}


def family_for_hf(hf: dict[str, Any], path: Path) -> Family:
    """The converter for a Hugging Face ``config.json`` (by ``model_type``, checked against ``architectures``)."""
    model_type = hf.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise GptlabError(
            f"{path}: model_type {model_type!r} is not supported; gptlab converts "
            f"{', '.join(f'{k} ({f.architecture})' for k, f in FAMILIES.items())}"
        )
    archs = hf.get("architectures") or [family.architecture]
    if family.architecture not in archs:
        raise GptlabError(
            f"{path}: architectures {archs} is not {family.architecture}; gptlab converts causal "
            f"language models only"
        )
    return family


def hf_config_to_gptlab(directory: str | os.PathLike[str]) -> GPTConfig:
    """The ``GPTConfig`` a Hugging Face directory describes (without reading the weights)."""
    directory = Path(directory)
    hf = read_hf_config(directory)
    return config_from_hf(hf, directory / CONFIG_FILE)


def config_from_hf(hf: dict[str, Any], path: Path) -> GPTConfig:
    """The gptlab config of a Hugging Face ``config.json`` (``path`` names it in errors)."""
    if hf.get("model_type") == hf_remote.MODEL_TYPE:
        return hf_remote.config_from_remote(hf, path)
    family = family_for_hf(hf, path)
    try:
        return family.config_from_hf(hf, path)
    except GptlabError as exc:
        msg = str(exc)
        raise GptlabError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def from_hf(
    directory: str | os.PathLike[str], dtype: torch.dtype | None = None, quantize: str | None = None
) -> GPT:
    """Read a ``GPT2LMHeadModel``, ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` directory into a ``GPT``.

    Reads ``config.json`` and ``model.safetensors`` (or its sharded index, or
    ``pytorch_model.bin`` with ``weights_only=True``). The weights keep full
    precision (float32) unless ``dtype`` is given. Anything gptlab cannot
    represent exactly is a ``GptlabError`` naming the file and the setting.
    ``quantize="int8" | "bf16"``: the model for inference in that format, converted tensor by tensor.
    """
    directory = Path(directory)
    hf = read_hf_config(directory)
    if hf.get("model_type") == hf_remote.MODEL_TYPE:  # gptlab's own remote-code export: read back as data
        if quantize is not None:
            raise GptlabError(f"{directory}: convert this gptlab folder first, then quantize the checkpoint")
        return hf_remote.read_remote(directory, hf, dtype)
    config = config_from_hf(hf, directory / CONFIG_FILE)
    family = family_for_hf(hf, directory / CONFIG_FILE)
    hf_state, source = read_hf_weights(directory)
    return model_from_hf_state(family, config, normalise_names(hf_state, family), source, dtype, quantize)


def model_from_hf_state(
    family: Family,
    config: GPTConfig,
    hf_state: Mapping[str, torch.Tensor],
    source: Path,
    dtype: torch.dtype | None,
    quantize: str | None = None,
) -> GPT:
    """A ``GPT`` (eval mode, CPU) from tensors under Hugging Face names, through ``family``'s name table.

    ``quantize="int8" | "bf16"``: converted tensor by tensor (``gptlab.model.load_quantized``).
    """
    shapes = model_state(build_empty(config, "meta"))  # names and shapes only, no memory
    if quantize is not None:
        from gptlab.model.load_quantized import build_quantized

        return build_quantized(
            config, import_lazy(family, config, hf_state, shapes, source), quantize, source
        )
    state = import_state(family, config, hf_state, shapes, source)
    model = build_empty(config)  # every parameter is overwritten next (load_model_state checks that)
    load_model_state(model, {k: v.float() for k, v in state.items()}, source)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.eval()


def tokenizer_from_hf(directory: str | os.PathLike[str]) -> Tokenizer | None:
    """The directory's tokenizer, or ``None`` if it has none gptlab reads.

    ``tokenizer.json`` (a byte-level BPE, with its special tokens, bos/eos and the chat template of
    ``tokenizer_config.json``) is preferred; else ``vocab.json`` + ``merges.txt`` (GPT-2's files).
    A SentencePiece or WordPiece tokenizer is a ``GptlabError``.
    """
    from gptlab.tokenizers import GPT2Tokenizer
    from gptlab.tokenizers.hf_files import read_hf_tokenizer

    directory = Path(directory)
    tokenizer = read_hf_tokenizer(directory)
    if tokenizer is not None:
        return tokenizer
    if not ((directory / "vocab.json").is_file() and (directory / "merges.txt").is_file()):
        return None
    return GPT2Tokenizer.from_dir(directory)


def export_family(config: GPTConfig) -> Family:
    """The first family of ``FAMILIES`` that computes ``config``'s function, or a ``GptlabError`` saying why none does."""
    if config.arch != "decoder" or not config.causal:  # the native families are causal decoders
        raise GptlabError(
            f"this model has no Hugging Face transformers equivalent: arch={config.arch!r}, causal={config.causal}"
        )
    problems = {}
    for key, family in FAMILIES.items():
        problems[key] = family.export_problems(config)
        if not problems[key]:
            return family
    why = "; ".join(f"as {FAMILIES[key].architecture} it needs {', '.join(p)}" for key, p in problems.items())
    raise GptlabError(f"this model has no Hugging Face transformers equivalent: {why}")


def native_family(config: GPTConfig) -> Family | None:
    """``export_family(config)``, or ``None`` when no transformers class computes the model's function."""
    try:
        return export_family(config)
    except GptlabError:
        return None


def export_description(model: GPT, remote_code: bool = False) -> str:
    """What ``to_hf`` writes for ``model`` and how to load it, e.g. ``"Qwen3ForCausalLM (AutoModelForCausalLM)"``."""
    family = None if remote_code else native_family(model.config)
    if family is not None:
        return f"{family.architecture} (AutoModelForCausalLM)"
    return (
        f"{hf_remote.remote_architecture(model)} remote code "
        f"({hf_remote.auto_class(model)}, trust_remote_code=True)"
    )


#: Files that would make a Hugging Face directory ambiguous if left beside ours.
_STALE = (SAFETENSORS_INDEX, BIN_FILE, BIN_INDEX)


def to_hf(
    model: GPT,
    directory: str | os.PathLike[str],
    tokenizer: Tokenizer | None = None,
    remote_code: bool = False,
) -> Path:
    """Write ``model`` as a Hugging Face directory: ``config.json`` + ``model.safetensors``.

    Where a transformers class computes the same function, the folder names it, and
    ``transformers.AutoModelForCausalLM.from_pretrained(directory)`` loads it: ``GPT2LMHeadModel``
    (learned positions, pre-LayerNorm, GELU/ReLU MLP, MHA, biases), ``LlamaForCausalLM`` (RoPE,
    pre-RMSNorm, SwiGLU, MHA/GQA/MQA) or ``Qwen3ForCausalLM`` (Llama + QK-norm, no biases).
    Every other model (``remote_code=True``: every model) is written with its own code
    (``gptlab.interop.hf_remote``) and loads with ``trust_remote_code=True``. ``tokenizer`` gives the
    bos/eos ids of the config (the tokenizer files are ``gptlab.tokenizers.hf_files``' job).
    Files are written atomically.
    """
    if not isinstance(model, GPT):
        raise GptlabError(f"to_hf needs a gptlab GPT model, got {type(model).__name__}")
    if getattr(model, "quantization", None) not in (None, "fp32"):
        raise GptlabError(
            f"a {model.quantization} inference model cannot be exported; export the float checkpoint"
        )
    config = model.config
    family = None if remote_code else native_family(config)
    directory = Path(directory)
    _check_out_dir(directory)
    if family is None:
        return hf_remote.write_remote(model, directory, tokenizer)
    tensors = export_state(family, config, model_state(model))
    hf_config = family.config_to_hf(config)
    hf_config["dtype"] = str(model.dtype).removeprefix("torch.")
    for key, value in hf_remote.token_ids(
        model, tokenizer
    ).items():  # the tokenizer's, where the config has none
        if hf_config.get(key) is None and value is not None and key != "decoder_start_token_id":
            hf_config[key] = value
    directory.mkdir(parents=True, exist_ok=True)
    write_tensors(directory / SAFETENSORS_FILE, tensors, metadata={"format": "pt"})
    atomic_write_json(directory / CONFIG_FILE, hf_config)
    return directory


def _is_gptlab_config(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and "gptlab_format" in data


def _check_out_dir(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise GptlabError(f"{directory}: exists and is not a directory")
    config = directory / CONFIG_FILE
    if config.is_file() and _is_gptlab_config(config):
        raise GptlabError(
            f"{directory}: holds a gptlab checkpoint; write the Hugging Face model to another directory"
        )
    stale = [name for name in _STALE if (directory / name).exists()]
    if stale:
        raise GptlabError(
            f"{directory}: already holds {', '.join(stale)}, which transformers could load instead "
            f"of the new weights; choose an empty directory"
        )


__all__ = [
    "FAMILIES",
    "export_description",
    "export_family",
    "from_hf",
    "hf_config_to_gptlab",
    "native_family",
    "to_hf",
    "tokenizer_from_hf",
]
