"""LoRA checkpoints: the adapters only, plus a reference to the pretrained base they adapt.

A LoRA checkpoint directory holds::

    config.json            {"gptlab_format": 1, "model": GPTConfig (as trained), "lora": LoRASpec}
    adapters.safetensors   every ``<layer>.lora_A`` (r, d_in) and ``<layer>.lora_B`` (d_out, r), float32
    tokenizer.json

``lora.base`` names the base (``path``, ``sha256``, ``kind``): a gptlab checkpoint, a
Hugging Face folder or a GGUF file, so merging on load (``gptlab.sources.load_merged``) sits
above this package: ``gptlab.checkpoint.load`` refuses a LoRA checkpoint with that hint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gptlab.checkpoint.files import (
    CONFIG_FILE,
    TOKENIZER_FILE,
    read_json,
    read_tensors,
    write_config,
    write_tensors,
)
from gptlab.errors import GptlabError
from gptlab.model.lora import LoRASpec, adapter_state, load_adapter_state

if TYPE_CHECKING:
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

ADAPTERS_FILE = "adapters.safetensors"


def is_lora_checkpoint(directory: str | os.PathLike[str]) -> bool:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        return False
    data = read_json(path)
    return isinstance(data, dict) and "lora" in data


def read_spec(directory: str | os.PathLike[str]) -> LoRASpec:
    data = read_json(Path(directory) / CONFIG_FILE)
    try:
        return LoRASpec.from_dict(data["lora"])
    except (GptlabError, TypeError, KeyError) as exc:
        raise GptlabError(f"{Path(directory) / CONFIG_FILE}: corrupt LoRA description ({exc})") from None


def save_adapters(model: GPT, tokenizer: Tokenizer | None, directory: str | os.PathLike[str]) -> Path:
    """Write the adapters of ``model`` (prepared by ``apply_lora``) as a LoRA checkpoint directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_tensors(directory / ADAPTERS_FILE, adapter_state(model), metadata={"format": "pt", "lora": "1"})
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER_FILE)
    write_config(directory / CONFIG_FILE, model.config, lora=model.lora_spec.to_dict())
    return directory


def check_base(spec: LoRASpec, sha256: str, where: str | os.PathLike[str]) -> None:
    """Refuse a base whose content is not the one the adapters were trained on."""
    if spec.base.get("sha256") != sha256:
        raise GptlabError(
            f"{where}: the base model {spec.base.get('path')} has changed since these adapters were "
            f"trained (sha256 {sha256[:12]}…, expected {str(spec.base.get('sha256'))[:12]}…); "
            f"restore the original base"
        )


def load_adapters(model: GPT, directory: str | os.PathLike[str]) -> None:
    """Resume: copy a checkpoint's adapters into ``model`` (adapted with the same spec and base)."""
    directory = Path(directory)
    saved = read_spec(directory)
    check_base(saved, model.lora_spec.base.get("sha256", ""), directory)
    load_adapter_state(model, read_tensors(directory / ADAPTERS_FILE), str(directory / ADAPTERS_FILE))
