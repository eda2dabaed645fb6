"""The network and nothing else: no file I/O, no tokenizer, no printing.

Besides the network: the state-dict mapping (``state_dict``), the int8/bf16 inference layers
(``quantized``, built while loading by ``load_quantized``) and the LoRA layers (``lora``), which
loading, training and generation all need. The model does not decode itself: ``gptlab.generate``.
"""

import contextlib
from collections.abc import Iterator

import torch

from gptlab.model.config import PRESETS, GPTConfig
from gptlab.model.encdec import BoundDecoder, EncoderDecoder
from gptlab.model.gpt import GPT, ModelOutput
from gptlab.model.kvcache import KVCache, KVView

#: config.arch → the model class (an encoder is a GPT without the causal mask)
MODELS: dict[str, type[GPT]] = {"decoder": GPT, "encoder": GPT, "encoder-decoder": EncoderDecoder}


def build_model(config: GPTConfig) -> GPT:
    """The model ``config.arch`` names: ``GPT`` (decoder or encoder) or ``EncoderDecoder``."""
    return MODELS[config.arch](config)


#: ``torch.nn.init``'s in-place initialisers, which ``skip_init`` turns into no-ops
INITIALISERS = ("normal_", "zeros_", "ones_", "uniform_", "kaiming_uniform_", "trunc_normal_")


@contextlib.contextmanager
def skip_init() -> Iterator[None]:
    """Make ``torch.nn.init``'s in-place initialisers no-ops while a model whose every weight is loaded
    next is built: drawing 100M+ random numbers takes seconds, and on the meta device each draw goes
    through PyTorch's reference decompositions, whose first use imports its compiler (seconds more)."""
    saved = {name: getattr(torch.nn.init, name) for name in INITIALISERS}
    try:
        for name in INITIALISERS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def build_empty(config: GPTConfig, device: str | torch.device | None = None) -> GPT:
    """``build_model(config)`` on ``device`` without initialising its weights, for a model whose weights
    are loaded next (``load_model_state`` checks that every one is).

    On the meta device (shapes only) the model is built on the CPU, where its weights are allocated but
    never written (no page of them is touched), and moved to the meta device with ``to_empty``: built on
    the meta device itself, its first computed buffer (RoPE's ``arange``) would run through PyTorch's
    Python reference kernels, whose first use imports the compiler (seconds at start-up).
    """
    meta = torch.device(device or "cpu").type == "meta"
    with skip_init(), torch.device("cpu" if meta else (device or "cpu")):
        model = build_model(config)
    return model.to_empty(device="meta") if meta else model


__all__ = [
    "INITIALISERS",
    "build_empty",
    "skip_init",
    "GPT",
    "GPTConfig",
    "BoundDecoder",
    "EncoderDecoder",
    "ModelOutput",
    "KVCache",
    "KVView",
    "MODELS",
    "PRESETS",
    "build_model",
]
