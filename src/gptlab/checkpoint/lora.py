"""LoRA checkpoints: the adapters only, plus a reference to the pretrained base they adapt.

A LoRA checkpoint directory holds::

    config.json            {"gptlab_format": 1, "model": GPTConfig (as trained), "lora": LoRASpec}
    adapters.safetensors   every ``<layer>.lora_A`` (r, d_in) and ``<layer>.lora_B`` (d_out, r), float32
    tokenizer.json

``lora.base`` names the base (``path``, ``sha256``, ``kind``): a gptlab checkpoint, a
Hugging Face folder or a GGUF file. ``load_merged`` reads the base, checks its sha256,
re-applies the adapters and merges them (``W ← W + (α/r)·B·A``), so every command that
loads a checkpoint accepts a LoRA run and sees a plain model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from gptlab.checkpoint.files import CONFIG_FILE, read_json, read_tensors, write_tensors
from gptlab.errors import GptlabError

ADAPTERS_FILE = "adapters.safetensors"


def is_lora_model(model: Any) -> bool:
    return "lora_spec" in getattr(model, "__dict__", {})


def is_lora_checkpoint(directory: str | os.PathLike[str]) -> bool:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        return False
    data = read_json(path)
    return isinstance(data, dict) and "lora" in data


def read_spec(directory: str | os.PathLike[str]) -> Any:
    from gptlab.train.lora import LoRASpec

    data = read_json(Path(directory) / CONFIG_FILE)
    try:
        return LoRASpec.from_dict(data["lora"])
    except (GptlabError, TypeError, KeyError) as exc:
        raise GptlabError(f"{Path(directory) / CONFIG_FILE}: corrupt LoRA description ({exc})") from None


def save_adapters(model: Any, tokenizer: Any | None, directory: str | os.PathLike[str]) -> Path:
    """Write the adapters of ``model`` (prepared by ``apply_lora``) as a LoRA checkpoint directory."""
    from gptlab.checkpoint.files import TOKENIZER_FILE
    from gptlab.checkpoint.model import write_config
    from gptlab.train.lora import adapter_state

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_tensors(directory / ADAPTERS_FILE, adapter_state(model), metadata={"format": "pt", "lora": "1"})
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER_FILE)
    write_config(directory / CONFIG_FILE, model.config, lora=model.lora_spec.to_dict())
    return directory


def check_base(spec: Any, sha256: str, where: str | os.PathLike[str]) -> None:
    """Refuse a base whose content is not the one the adapters were trained on."""
    if spec.base.get("sha256") != sha256:
        raise GptlabError(
            f"{where}: the base model {spec.base.get('path')} has changed since these adapters were "
            f"trained (sha256 {sha256[:12]}…, expected {str(spec.base.get('sha256'))[:12]}…); "
            f"restore the original base"
        )


def load_adapters(model: Any, directory: str | os.PathLike[str]) -> None:
    """Resume: copy a checkpoint's adapters into ``model`` (adapted with the same spec and base)."""
    from gptlab.train.lora import load_adapter_state

    directory = Path(directory)
    saved = read_spec(directory)
    check_base(saved, model.lora_spec.base.get("sha256", ""), directory)
    load_adapter_state(model, read_tensors(directory / ADAPTERS_FILE), str(directory / ADAPTERS_FILE))


def load_merged(
    directory: str | os.PathLike[str], device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[Any, Any | None]:
    """The base with the adapters merged in (float32 while merging), as a plain ``GPT``."""
    from gptlab.checkpoint.files import TOKENIZER_FILE
    from gptlab.checkpoint.model import check_tokenizer_fits, load_tokenizer
    from gptlab.train import init
    from gptlab.train.lora import apply_lora, load_adapter_state, merge_lora

    directory = Path(directory)
    spec = read_spec(directory)
    base_path = spec.base.get("path")
    if not base_path or not Path(base_path).exists():
        raise GptlabError(
            f"{directory}: the base model of these adapters ({base_path}) is missing; "
            f"restore it at that path to load the run"
        )
    check_base(spec, init.source_sha256(base_path), directory)
    model, _ = init.load_source(base_path)
    model.float()
    float_spec = type(spec).from_dict({**spec.to_dict(), "base_format": "float32", "dropout": 0.0})
    apply_lora(model, float_spec)
    load_adapter_state(model, read_tensors(directory / ADAPTERS_FILE), str(directory / ADAPTERS_FILE))
    merge_lora(model)
    for p in model.parameters():
        p.requires_grad_(True)
    if dtype is not None:
        model.to(dtype=dtype)
    tokenizer = load_tokenizer(directory)
    check_tokenizer_fits(tokenizer, model.config.vocab_size, directory / TOKENIZER_FILE)
    return model.to(device).eval(), tokenizer
