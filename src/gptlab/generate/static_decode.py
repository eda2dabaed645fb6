"""Which path decodes: the static one (CUDA graphs) where it can, the dynamic reference elsewhere.

``generate_ids`` (``GPT.generate``), ``generate_batch``, ``stream`` and ``gptlab sample`` start
through ``gptlab.generate.decode._start``; it asks ``use_static`` here. The static path is taken

    on CUDA (unless ``GPTLAB_STATIC=0``), or where ``static_decode(model)`` asked for it (on a
    CPU ``--compile`` does, for batches of two or more and the server: a step with frozen weights),
    when every option can be sampled inside the graph (``graph_sampling.supports``),
    the cache is a float cache, and nobody wants per-token probabilities.

Each model keeps one ``StaticSession`` (its captured graphs live as long as it does); a request
that needs more rows or a longer context than it has gets a larger one.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gptlab.generate.config import SampleConfig
from gptlab.generate.graph_sampling import supports
from gptlab.generate.static import StaticSession


@dataclass
class _Choice:
    """What ``static_decode`` asked for a model."""

    enabled: bool = True
    compile: bool | None = None
    compile_options: dict | None = None
    lookahead: int | None = None
    min_batch: int = 1


_ASKED: weakref.WeakKeyDictionary[nn.Module, _Choice] = weakref.WeakKeyDictionary()
_SESSIONS: weakref.WeakKeyDictionary[nn.Module, StaticSession] = weakref.WeakKeyDictionary()


def static_decode(
    model: nn.Module,
    enabled: bool = True,
    compile: bool | None = None,
    compile_options: dict | None = None,
    lookahead: int | None = None,
    min_batch: int = 1,
) -> nn.Module:
    """Decode ``model`` through the static path on any device (``enabled=False``: never); returns it.

    ``compile=None`` captures CUDA graphs on CUDA and runs the same step eagerly elsewhere
    (``compile=True`` on a CPU: the step with frozen weights, ``gptlab.generate.frozen_step``);
    ``lookahead`` is ``StaticSession``'s (steps per host sync; None: its default); ``min_batch``:
    ``generate`` calls of fewer sequences keep the dynamic path (the server's lane takes every one).
    """
    _SESSIONS.pop(model, None)
    _ASKED[model] = _Choice(enabled, compile, compile_options, lookahead, min_batch)
    return model


def static_wanted(model: Any) -> bool:
    """True where the static path is wanted: asked by ``static_decode``, or on CUDA unless refused.

    Never for ALiBi in half precision: attending over all ``T_max`` slots, a row's bias
    ``−m·(T_max − 1 − j)`` is off by ``m·(T_max − 1 − pos)``, a constant softmax ignores in float32
    but that bf16 (8 bits of mantissa: steps of 4 at 512) would round the scores with.
    """
    config = getattr(model, "config", None)
    if getattr(config, "pos", None) == "alibi" and getattr(model, "dtype", None) in (
        torch.bfloat16,
        torch.float16,
    ):
        return False
    choice = _ASKED.get(model)
    if choice is not None:
        return choice.enabled
    device = getattr(model, "device", torch.device("cpu"))
    return device.type == "cuda" and os.environ.get("GPTLAB_STATIC", "1") != "0"


def use_static(
    model: Any, config: SampleConfig, cache_dtype: torch.dtype | None, want_probs: bool, batch: int = 1
) -> bool:
    """True when this request of ``batch`` sequences should take the static path (module docstring)."""
    float_cache = cache_dtype is None or cache_dtype.is_floating_point
    choice = _ASKED.get(model)
    if choice is not None and batch < choice.min_batch:
        return False
    return static_wanted(model) and supports(config) and float_cache and not want_probs


def session_for(
    model: Any, batch: int, max_len: int, cache_dtype: torch.dtype | None, vocab: int
) -> StaticSession:
    """The model's static session if it is free and large enough, else a new (larger) one."""
    old = _SESSIONS.get(model)
    fits = (
        old is not None
        and not old.rows
        and old.max_batch >= batch
        and old.max_len >= max_len
        and old.vocab == vocab
        and (cache_dtype is None or old.cache.dtype == cache_dtype)
    )
    if fits:
        assert old is not None
        return old
    if old is not None and not old.rows:
        batch, max_len = max(batch, old.max_batch), max(max_len, old.max_len)
    choice = _ASKED.get(model) or _Choice()
    rows = 1 << (batch - 1).bit_length()  # a power of two: later, smaller requests reuse it
    session = StaticSession(
        model,
        rows,
        max_len,
        cache_dtype,
        vocab,
        compile=choice.compile,
        compile_options=choice.compile_options,
        lookahead=choice.lookahead,
    )
    _SESSIONS[model] = session  # a busy old session lives on with the stream that holds it
    return session


class _Chosen:
    """A ``TokenStep``'s sampler on the static path: the token was already chosen inside the graph."""

    def process(self, token: int, history: Sequence[int]) -> int:
        return token

    def choose(self, token: int) -> int:
        return token


CHOSEN = _Chosen()


def start_static(
    model: Any,
    tokenizer: Any | None,
    prompts: Sequence[Sequence[int]],
    config: SampleConfig,
    cache_dtype: torch.dtype | None,
    seeds: Sequence[int | None] | None,
) -> tuple[StaticSession, list[Any]]:
    """Prefill ``prompts`` into the model's static session → the session and one decoding row each.

    Each row's ``TokenStep`` (stops, text, finish reason) is the one the dynamic path uses; only
    its sampler is ``CHOSEN``, and the seed its ``Sampler`` drew seeds the row inside the graph.
    """
    from gptlab.generate.decode import _Row
    from gptlab.generate.step import TokenStep, session_len, vocab_size

    session = session_for(
        model, len(prompts), session_len(model, prompts, config), cache_dtype, vocab_size(model, tokenizer)
    )
    steps = []
    for i, prompt in enumerate(prompts):
        cfg = config if seeds is None else config.replace(seed=seeds[i])
        steps.append(TokenStep(cfg, tokenizer, model, prompt, index=i))
    seeds_drawn = [step.sampler.generator.initial_seed() for step in steps]
    added = session.add_many(prompts, [step.config for step in steps], seeds_drawn)
    rows = []
    for step, (slot, token) in zip(steps, added, strict=True):
        step.history = list(session.tokens[slot])  # the prompt as cached (cut to the context)
        step.sampler = CHOSEN  # type: ignore[assignment]
        rows.append(_Row(slot, step, token))  # type: ignore[arg-type]
    return session, rows
