"""gptlab: a GPT from first principles, made into real software."""

from gptlab.errors import GptlabError
from gptlab.model import GPT, GPTConfig, KVCache

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: keep ``import gptlab`` light
    lazy = {
        "save": ("gptlab.checkpoint", "save"),
        "load": ("gptlab.checkpoint", "load"),
        "from_hf": ("gptlab.interop.hf", "from_hf"),
        "to_hf": ("gptlab.interop.hf", "to_hf"),
        "quantize": ("gptlab.quantize", "quantize"),
        "generate_text": ("gptlab.generate", "generate_text"),
        "SampleConfig": ("gptlab.generate", "SampleConfig"),
        "TrainConfig": ("gptlab.train", "TrainConfig"),
    }
    if name in lazy:
        import importlib

        module, attr = lazy[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gptlab' has no attribute {name!r}")


__all__ = [
    "GPT",
    "GPTConfig",
    "GptlabError",
    "KVCache",
    "save",
    "load",
    "from_hf",
    "to_hf",
    "quantize",
    "generate_text",
    "SampleConfig",
    "TrainConfig",
    "__version__",
]
