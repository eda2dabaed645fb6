"""What generation needs of a model: ``Decoder``, a GPT or an encoder–decoder bound to its source.

Every engine reads the same few things: the configuration (context, vocabulary, heads), whether
positions come from a table (the window past the context depends on it), the device and dtype, and
``run(idx, pos=…, cache=…, attn_mask=…, last_only=…)``, one forward pass over a ``LayeredCache``.
``GPT`` and ``EncoderDecoder.bind(source)`` both satisfy it.
"""

from __future__ import annotations

from typing import Protocol

import torch

from gptlab.errors import GptlabError
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import ModelOutput
from gptlab.model.kvcache import LayeredCache
from gptlab.model.positional import PositionalEncoding


def logits_of(out: ModelOutput) -> torch.Tensor:
    """The logits of a forward pass (generation never asks for the chunked loss, which has none)."""
    if out.logits is None:
        raise GptlabError("the forward pass returned no logits (a chunked loss); generation needs them")
    return out.logits


class Decoder(Protocol):
    """A model that generation can decode (see the module docstring)."""

    config: GPTConfig
    positional: PositionalEncoding

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def run(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        pos: torch.Tensor | None = None,
        cache: LayeredCache | None = None,
        attn_mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> ModelOutput: ...
