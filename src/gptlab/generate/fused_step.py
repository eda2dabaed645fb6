"""A decode step as one compiled graph (CPU, one sequence): ``decode_one_token``.

A decode step of gpt2 runs ~300 small operations: 48 one-row matrix products and, around
them, norms, views, the cache write and read, attention and residual adds. Run one by one,
the Python and dispatch between them cost about as much as the products
(docs/benchmarks.md#decoding). ``decode_one_token`` is that whole step,

    write k_t, v_t at cache index t = end − 1;   attend over K, V[0, end);   logits_t

written over plain tensors (the session's cache rows) and an ``end`` that ``torch.compile``
treats as a symbol, so one graph serves every length and nothing recompiles as the cache
fills. Inside it each ``InferenceLinear`` inlines its ``gemv`` and inductor fuses the step
into a dozen kernels per layer.

``one_token_step()`` wraps it in a ``Compiled``; the model's ``DecodeEngine``
(``gptlab.generate.engine``) holds that one object, so every session of the model reuses the
graph. ``plan_decoding`` decides when it runs: a session of one row on a CPU with a float KV cache,
when compiling pays. Its logits equal the layer-by-layer path's (tested).
"""

from __future__ import annotations

import torch

from gptlab.compiling import Compiled
from gptlab.generate.decoder import Decoder, logits_of

# Inductor inlines a cheap elementwise producer into each consumer. In front of a one-row
# product that would recompute a norm's output once per output channel (50,257 times for the
# head); realising every producer of more than a few operations computes it once.
_OPTIONS = {"realize_opcount_threshold": 10}


class StepLayer:
    """One layer's cache for the step: write at ``end − 1``, read ``[0, end)``."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, end: int) -> None:
        self.k, self.v, self.end = k, v, end

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k[:, :, self.end - 1 : self.end] = k.to(self.k.dtype)
        self.v[:, :, self.end - 1 : self.end] = v.to(self.v.dtype)
        return self.k[:, :, : self.end], self.v[:, :, : self.end]


class StepCache:
    """What ``GPT.run`` calls ``cache`` (a ``gptlab.model.kvcache.LayeredCache``): one ``StepLayer`` per layer."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], end: int) -> None:
        self.layers = [StepLayer(k, v, end) for k, v in zip(keys, values, strict=True)]


def decode_one_token(
    model: Decoder,
    idx: torch.Tensor,  # (1, 1) the new token
    pos: torch.Tensor,  # (1,) its position
    keys: list[torch.Tensor],  # per layer (1, H_kv, T_max, d_k)
    values: list[torch.Tensor],
    end: int,  # cached positions after this step
) -> torch.Tensor:
    """Next-token logits (1, vocab) float32 after appending ``idx`` at cache index ``end − 1``."""
    out = model.run(idx, pos=pos, cache=StepCache(keys, values, end), last_only=True)
    return logits_of(out)[:, -1].float()


def one_token_step() -> Compiled:
    """``decode_one_token`` through ``torch.compile`` (compiled at its first call, one graph for every length)."""
    return Compiled(decode_one_token, "the compiled decode step", dynamic=True, options=_OPTIONS)
