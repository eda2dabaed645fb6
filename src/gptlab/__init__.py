"""gptlab: a GPT from first principles, made into real software.

Everything is imported lazily, so ``import gptlab.tokenizers`` works without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from gptlab.errors import GptlabError

__version__ = "0.1.0"

_LAZY = {
    "GPT": ("gptlab.model", "GPT"),
    "GPTConfig": ("gptlab.model", "GPTConfig"),
    "KVCache": ("gptlab.model", "KVCache"),
    "save": ("gptlab.checkpoint", "save"),
    "load": ("gptlab.sources", "load"),
    "from_hf": ("gptlab.interop.hf", "from_hf"),
    "to_hf": ("gptlab.interop.hf", "to_hf"),
    "from_gguf": ("gptlab.interop.gguf", "from_gguf"),
    "to_gguf": ("gptlab.interop.gguf_export", "to_gguf"),
    "quantize": ("gptlab.model.weight_formats", "quantize"),
    "generate_text": ("gptlab.generate", "generate_text"),
    "generate_ids": ("gptlab.generate", "generate_ids"),
    "prepare_decoding": ("gptlab.generate", "prepare_decoding"),
    "SampleConfig": ("gptlab.generate", "SampleConfig"),
    "TrainConfig": ("gptlab.train", "TrainConfig"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gptlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["GptlabError", "__version__", *_LAZY]
