"""Generation: KV-cached prefill and decode, every decoding strategy, streaming, batching.

    prefill:  logits = GPT(prompt), filling K_cache, V_cache          (blueprint §10)
    decode:   logits_t = GPT(x_t | K_cache, V_cache), one token a step
    choose:   greedy / temperature / top-k / top-p / min-p / beam     (blueprint §12)

``stream_events`` (and ``stream``, its text-only view) is the primitive;
``generate_text``, ``generate_batch`` and ``generate_ids`` (``GPT.generate``) are
built on the same decoding loop over a ``BatchSession``; each request's per-token step
(``RequestState``: sampling, stops, UTF-8-safe text, finish reason) is shared with the server.
An encoder–decoder model goes through the same functions (the prompt is its source).

How a model decodes is one printable ``DecodePlan`` (``plan_decoding``): a dynamic or a static
cache, layer by layer or a compiled step (the fused one-row CPU step, the frozen CPU step, CUDA
graphs), a per-request or in-graph sampler. ``prepare_decoding(model, compile=..., static=...)``
sets what the caller wants and keeps the compiled steps on the model's ``PreparedDecoding``. A
``PrefixCache`` passed to ``stream_events`` (the server's scheduler and ``gptlab chat`` keep one) lets a
prompt reuse the keys and values of a prefix decoded before.

The modules, read in this order (docs/design/decode-engines.md):

    config.py        SampleConfig: every decoding option of a request, validated
    plan.py          plan_decoding → DecodePlan, the one decider; Decoder, what it reads of a model
    driver.py        the one driver: the entry points, start → decode_rows, the encoder–decoder route
    request.py       RequestState: one request's logits → token → text → stop; TextStream
    sampling.py      the one sampler: penalties, bias, grammar mask, τ, top-k/p, min-p, the seeded draw
    session.py       BatchSession (the dynamic KV cache); the Session protocol and the window
    static.py        StaticSession (fixed shapes, CUDA graphs), its step, the frozen CPU step
    prepared.py      PreparedDecoding: a model's settings and compiled steps
    one_token.py     the fused one-row CPU step and the package that keeps it compiled
    prompt_pass.py   a prompt's pass of one row, kept compiled beside the one-row step
    beam.py          beam search
    lookup.py        prompt-lookup drafts, verified in one pass
    grammar.py       structured output: a JSON schema, regex or grammar as a mask per token
    prefix_cache.py  keys and values of earlier prompts, reused by the next that starts alike
"""

from gptlab.generate.beam import beam_search
from gptlab.generate.config import SampleConfig
from gptlab.generate.driver import (
    encode_prompt,
    generate_batch,
    generate_ids,
    generate_text,
    stream,
    stream_events,
)
from gptlab.generate.plan import DecodePlan, DecodeSettings, ModelFacts, plan_decoding
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.prepared import PreparedDecoding, prepare_decoding, prepared_of
from gptlab.generate.request import RequestState, TextStream, TokenEvent, fit_prompt, stop_token_ids
from gptlab.generate.sampling import Sampler
from gptlab.generate.session import BatchSession, ContextWarning, Session
from gptlab.generate.static import StaticSession

__all__ = [
    "BatchSession",
    "ContextWarning",
    "PreparedDecoding",
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
    "RequestState",
    "beam_search",
    "encode_prompt",
    "prepared_of",
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
