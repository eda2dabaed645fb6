"""The network and nothing else: no file I/O, no tokenizer, no printing.

Besides the network: the state-dict mapping (``state_dict``), the int8/bf16 inference layers
(``quantized``, built while loading by ``load_quantized``) and the LoRA layers (``lora``), which
loading, training and generation all need. The model does not decode itself: ``gptlab.generate``.
"""

from gptlab.model.config import PRESETS, GPTConfig
from gptlab.model.encdec import BoundDecoder, EncoderDecoder
from gptlab.model.gpt import GPT, ModelOutput
from gptlab.model.kvcache import KVCache, LayerKVCache

#: config.arch → the model class (an encoder is a GPT without the causal mask)
MODELS: dict[str, type[GPT]] = {"decoder": GPT, "encoder": GPT, "encoder-decoder": EncoderDecoder}


def build_model(config: GPTConfig) -> GPT:
    """The model ``config.arch`` names: ``GPT`` (decoder or encoder) or ``EncoderDecoder``."""
    return MODELS[config.arch](config)


__all__ = [
    "GPT",
    "GPTConfig",
    "BoundDecoder",
    "EncoderDecoder",
    "ModelOutput",
    "KVCache",
    "LayerKVCache",
    "MODELS",
    "PRESETS",
    "build_model",
]
