"""One checkpoint directory: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from gptlab.checkpoint import lora
from gptlab.checkpoint.files import (
    CONFIG_FILE,
    FORMAT_VERSION,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    read_json,
    read_tensors,
    resolve_checkpoint,
    write_tensors,
)
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json
from gptlab.model import GPT, GPTConfig, build_model

VOCAB_ROWS = ("wte.weight", "lm_head.weight")  # tensors with one row per token


def model_state(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights as saved: a tied ``lm_head.weight`` is left out (it is ``wte.weight``),
    and the vocabulary's padding rows (``GPTConfig.vocab_multiple``) are cut off."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
    for name in VOCAB_ROWS:
        if name in state:
            state[name] = state[name][: model.config.vocab_size]
    return state


def _pad_vocab(model: GPT, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with zero padding rows appended to the vocabulary tensors, as ``model`` holds them."""
    rows = model.config.padded_vocab_size - model.config.vocab_size
    if not rows:
        return state
    out = dict(state)
    for name in VOCAB_ROWS:
        if name in out:
            t = out[name]
            out[name] = torch.cat([t, t.new_zeros(rows, *t.shape[1:])])
    return out


def load_model_state(model: GPT, state: dict[str, torch.Tensor], source: str | os.PathLike[str]) -> None:
    """Copy ``state`` into ``model``; a missing, extra or mis-shaped tensor names ``source``."""
    expected = model_state(model)
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise GptlabError(
            f"{source}: weights do not match config.json "
            f"(missing: {', '.join(missing[:5]) or 'none'}; unexpected: {', '.join(extra[:5]) or 'none'})"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise GptlabError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)} but config.json "
                f"implies {tuple(expected[name].shape)}"
            )
    model.load_state_dict(_pad_vocab(model, state), strict=not model.config.tie_embeddings)


def write_config(path: str | os.PathLike[str], config: GPTConfig, **extra: Any) -> None:
    atomic_write_json(path, {"gptlab_format": FORMAT_VERSION, "model": config.to_dict(), **extra})


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


def save(model: GPT, tokenizer: Any | None, directory: str | os.PathLike[str]) -> Path:
    """Write ``model`` (and ``tokenizer``, if given) as a checkpoint directory."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise GptlabError(f"{directory}: exists and is not a directory")
    if lora.is_lora_model(model):  # a LoRA run's checkpoints hold only the adapters
        return lora.save_adapters(model, tokenizer, directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_tensors(
        directory / WEIGHTS_FILE, model_state(model), metadata={"format": "pt", "gptlab_format": "1"}
    )
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER_FILE)
    write_config(directory / CONFIG_FILE, model.config)
    return directory


def load(
    path: str | os.PathLike[str], device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[GPT, Any | None]:
    """Read a checkpoint directory (or a run directory: its latest checkpoint) → ``(model, tokenizer_or_None)``."""
    directory = resolve_checkpoint(path)
    from gptlab.checkpoint.sharded import require_consolidated

    require_consolidated(directory)  # FSDP shards: a one-line hint to consolidate first
    if lora.is_lora_checkpoint(directory):  # the one place LoRA adapters are merged on load
        return lora.load_merged(directory, device, dtype)
    config = read_config(directory / CONFIG_FILE)
    state = read_tensors(directory / WEIGHTS_FILE)
    model = build_model(config)
    load_model_state(model, state, directory / WEIGHTS_FILE)
    if dtype is not None:
        model.to(dtype=dtype)
    model.to(device).eval()
    tokenizer = load_tokenizer(directory)
    check_tokenizer_fits(tokenizer, config.vocab_size, directory / TOKENIZER_FILE)
    return model, tokenizer


def check_tokenizer_fits(tokenizer: Any | None, vocab_size: int, source: str | os.PathLike[str]) -> None:
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


def load_tokenizer(directory: str | os.PathLike[str]) -> Any | None:
    path = Path(directory) / TOKENIZER_FILE
    if not path.exists():
        return None
    from gptlab import tokenizers

    return tokenizers.load(path)
