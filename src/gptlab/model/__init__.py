"""The network and nothing else: no file I/O, no tokenizer, no printing."""

from gptlab.model.config import PRESETS, GPTConfig
from gptlab.model.gpt import GPT, ModelOutput
from gptlab.model.kvcache import KVCache, LayerKVCache

__all__ = ["GPT", "GPTConfig", "ModelOutput", "KVCache", "LayerKVCache", "PRESETS"]
