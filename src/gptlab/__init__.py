"""gptlab: a GPT from first principles, made into real software.

Everything is imported lazily, so ``import gptlab.tokenizers`` works without torch.
"""

from __future__ import annotations

from gptlab.errors import GptlabError
from gptlab.lazy import lazy_names

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


__getattr__, __dir__ = lazy_names("gptlab", _LAZY, globals())


__all__ = ["GptlabError", "__version__", *_LAZY]
