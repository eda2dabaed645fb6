"""Generation: KV-cached prefill and decode, every decoding strategy, streaming, batching.

    prefill:  logits = GPT(prompt), filling K_cache, V_cache          (blueprint §10)
    decode:   logits_t = GPT(x_t | K_cache, V_cache), one token a step
    choose:   greedy / temperature / top-k / top-p / min-p / beam     (blueprint §12)

``stream_events`` (and ``stream``, its text-only view) is the primitive;
``generate_text``, ``generate_batch`` and ``generate_ids`` (``GPT.generate``) are
built on the same decoding loop over a ``BatchSession``; each request's per-token step
(``TokenStep``: sampling, stops, UTF-8-safe text, finish reason) is shared with the server. ``compile_decode(model)`` makes each
one-sequence decode step on a CPU a single compiled graph. On CUDA the same calls decode through
``StaticSession`` (a static KV cache, one CUDA graph per batch-size bucket, the sampler inside
it); ``static_decode(model)`` asks for that path anywhere.
"""

from gptlab.generate.beam import beam_search
from gptlab.generate.config import SampleConfig
from gptlab.generate.decode import (
    encode_prompt,
    generate_batch,
    generate_ids,
    generate_text,
    stream,
    stream_events,
)
from gptlab.generate.fused_step import compile_decode
from gptlab.generate.sampling import Sampler
from gptlab.generate.session import BatchSession, ContextWarning
from gptlab.generate.static import StaticSession
from gptlab.generate.static_decode import static_decode
from gptlab.generate.step import TokenEvent, TokenStep, fit_prompt, stop_token_ids
from gptlab.generate.textstream import TextStream

__all__ = [
    "BatchSession",
    "ContextWarning",
    "SampleConfig",
    "Sampler",
    "StaticSession",
    "TextStream",
    "TokenEvent",
    "TokenStep",
    "beam_search",
    "compile_decode",
    "encode_prompt",
    "fit_prompt",
    "generate_batch",
    "generate_ids",
    "generate_text",
    "static_decode",
    "stop_token_ids",
    "stream",
    "stream_events",
]
