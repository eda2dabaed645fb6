"""Generation: KV-cached prefill and decode, every decoding strategy, streaming, batching.

    prefill:  logits = GPT(prompt), filling K_cache, V_cache          (blueprint §10)
    decode:   logits_t = GPT(x_t | K_cache, V_cache), one token a step
    choose:   greedy / temperature / top-k / top-p / min-p / beam     (blueprint §12)

``stream_events`` (and ``stream``, its text-only view) is the primitive;
``generate_text``, ``generate_batch`` and ``generate_ids`` (``GPT.generate``) are
built on the same decoding loop over a ``BatchSession``; each request's per-token step
(``TokenStep``: sampling, stops, UTF-8-safe text, finish reason) is shared with the server.
An encoder–decoder model goes through the same functions (the prompt is its source).

How a model decodes is one printable ``DecodePlan`` (``plan_decoding``): a dynamic or a static
cache, layer by layer or a compiled step (the fused one-row CPU step, the frozen CPU step, CUDA
graphs), a per-request or in-graph sampler. ``prepare_decoding(model, compile=..., static=...)``
sets what the caller wants and keeps the compiled steps on the model's ``DecodeEngine``. A
``PrefixCache`` passed to ``stream_events`` (the server's scheduler and ``gptlab chat`` keep one) lets a
prompt reuse the keys and values of a prefix decoded before.
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
from gptlab.generate.engine import DecodeEngine, engine_of, prepare_decoding
from gptlab.generate.plan import DecodePlan, DecodeSettings, ModelFacts, plan_decoding
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.sampling import Sampler
from gptlab.generate.session import BatchSession
from gptlab.generate.static import StaticSession
from gptlab.generate.step import TokenEvent, TokenStep, fit_prompt, stop_token_ids
from gptlab.generate.textstream import TextStream
from gptlab.generate.window import ContextWarning, Session

__all__ = [
    "BatchSession",
    "ContextWarning",
    "DecodeEngine",
    "DecodePlan",
    "DecodeSettings",
    "ModelFacts",
    "PrefixCache",
    "SampleConfig",
    "Sampler",
    "Session",
    "StaticSession",
    "TextStream",
    "TokenEvent",
    "TokenStep",
    "beam_search",
    "encode_prompt",
    "engine_of",
    "fit_prompt",
    "generate_batch",
    "generate_ids",
    "generate_text",
    "plan_decoding",
    "prepare_decoding",
    "stop_token_ids",
    "stream",
    "stream_events",
]
