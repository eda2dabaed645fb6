"""What ``prepare_decoding`` attaches to a model (``PreparedDecoding``): its settings, its compiled steps, its static session.

    prepare_decoding(model, compile="auto", planned_tokens=N)   the caller's choice, once
    prepared_of(model).plan(batch, config=…)                       → DecodePlan (gptlab.generate.plan)
    engine.dynamic_session(plan, …) / engine.static_session(plan, …)  → a Session that runs it

Compiled steps are expensive (seconds to minutes), so a model decoded twice must not compile twice.
They live on the ``PreparedDecoding`` that ``prepare_decoding`` attaches to the model as
``model.decode_engine`` (an explicit call; a model never prepared gets the library's defaults at
its first generation): the fused one-row step, the frozen CPU steps (``FrozenSteps``) and the static
session whose CUDA graphs later requests replay. Nothing is kept in a module-level registry: the
engine, and with it every compiled step, goes away with the model. A deep copy of the model starts
without one.

The fused one-row step and its kept package: ``gptlab.generate.one_token``; the kept prompt pass:
``gptlab.generate.prompt_pass``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from torch import nn

from gptlab.compiling import Compiled
from gptlab.generate.config import SampleConfig
from gptlab.generate.one_token import STEP, StoredStep, one_token_step
from gptlab.generate.plan import DecodePlan, Decoder, DecodeSettings, ModelFacts, plan_decoding
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.prompt_pass import PROMPT, KeptPrompt, applies
from gptlab.generate.session import BatchSession
from gptlab.generate.static import FrozenSteps, StaticSession
from gptlab.hardware import HugePageThread, back_with_huge_pages_later, keep_heap
from gptlab.model.kvcache import default_cache_dtype

#: the model attribute that holds its engine
ATTRIBUTE = "decode_engine"
#: steps whose static sessions compile (the rest run the same step eagerly)


class PreparedDecoding:
    """The decode settings of one model and everything compiled for it (see the module docstring)."""

    def __init__(self, model: Decoder, settings: DecodeSettings | None = None) -> None:
        self.model = model
        self.settings = settings or DecodeSettings()
        #: the thread that moves the weights onto huge pages (``weights_on_huge_pages``), once started
        self.huge_pages: HugePageThread | None = None
        if model.device.type == "cpu":
            keep_heap()  # an eager prefill's blocks reused, not page-faulted afresh (gptlab.hardware)
        self.frozen = FrozenSteps(model)  # the frozen CPU steps, one per sampler flavour
        self._one_token: Compiled | None = None
        self._prompt: KeptPrompt | None = None
        #: the static session later requests reuse while it is free and large enough
        self.static: StaticSession | None = None
        self._folders: dict[torch.dtype, Path] = {}

    def weights_on_huge_pages(self) -> None:
        """On a CPU, start moving the weights onto 2 MB huge pages in a thread (once per model;
        ``gptlab.hardware.back_with_huge_pages``): each token streams every weight, and on 4 KB pages
        that costs a TLB miss every 4 KB. A session calls it at its first decode step, not at the
        prefill: moving a page briefly holds the process's memory map, and a prefill, which faults
        pages in for its activations, then waited for it (SmolLM2 float32: 1.5 s against 0.5 s)."""
        if self.huge_pages is None and self.model.device.type == "cpu" and isinstance(self.model, nn.Module):
            self.huge_pages = back_with_huge_pages_later([*self.model.parameters(), *self.model.buffers()])

    def __deepcopy__(self, memo: dict[int, object]) -> None:
        """A copied model starts without an engine (its compiled steps would point at the original)."""
        return None

    def plan(
        self,
        batch: int,
        *,
        config: SampleConfig | None = None,
        cache_dtype: torch.dtype | None = None,
        want_probs: bool = False,
    ) -> DecodePlan:
        """How a decode of ``batch`` sequences runs now (``plan_decoding`` over this model's facts,
        with whether the compile cache holds its one-row step for this cache dtype)."""
        return plan_decoding(
            self.facts(cache_dtype),
            self.settings,
            batch,
            config=config,
            cache_dtype=cache_dtype,
            want_probs=want_probs,
        )

    def facts(self, cache_dtype: torch.dtype | None = None) -> ModelFacts:
        """``ModelFacts.of`` the model, with whether the compile cache keeps its one-row step."""
        facts = ModelFacts.of(self.model)
        if self.settings.compile_cache is not None and facts.device == "cpu":
            folder = self.step_folder(cache_dtype)
            prompt = PROMPT.kept_in(folder) if folder is not None and applies(self.model) else None
            facts = dataclasses.replace(facts, kept_step=self.step_kept(cache_dtype), kept_prompt=prompt)
        return facts

    def step_folder(self, cache_dtype: torch.dtype | None = None) -> Path | None:
        """Where the compile cache keeps this model's one-row step over a cache of ``cache_dtype``
        (None: the default, ``default_cache_dtype``); None without a compile cache or for an int8 cache."""
        if self.settings.compile_cache is None:
            return None
        dtype = cache_dtype or default_cache_dtype(self.model.dtype, self.model.device)
        if not dtype.is_floating_point:
            return None
        if dtype not in self._folders:  # the key hashes the model's tensors' layout: once per dtype
            store = StoredStep(Path(self.settings.compile_cache))
            self._folders[dtype] = store.folder(store.key(self.model, dtype))
        return self._folders[dtype]

    def step_kept(self, cache_dtype: torch.dtype | None = None) -> bool:
        """Whether the compile cache holds this model's one-row step (``step_folder``): a record
        beside a package; ``StoredStep.load`` verifies them when the step first runs."""
        folder = self.step_folder(cache_dtype)
        return folder is not None and STEP.kept_in(folder)

    @property
    def one_token(self) -> Compiled:
        """The compiled one-row step (``fused_step.decode_one_token``), built once per model: loaded
        from ``settings.compile_cache`` or compiled (into it), in the background unless
        ``settings.compile_wait``."""
        if self._one_token is None:
            self._one_token = one_token_step(
                self.settings.compile_cache, background=not self.settings.compile_wait
            )
        return self._one_token

    @property
    def prompt(self) -> KeptPrompt:
        """The kept prompt pass (``gptlab.generate.prompt_pass``), loaded from ``settings.compile_cache``
        at the first prompt it takes; built once per model."""
        if self._prompt is None:
            assert self.settings.compile_cache is not None
            self._prompt = KeptPrompt(self.settings.compile_cache)
        return self._prompt

    def prompt_pass(self, plan: DecodePlan) -> KeptPrompt | None:
        """The kept prompt pass where ``plan`` runs it (``plan.prompt``), else None."""
        return self.prompt if plan.prompt == "kept" else None

    def prompts_ran(self) -> str:
        """How many prompts the kept prompt pass took, in words ("" when it was never given one):
        e.g. ``prompt pass ran: compiled 1 (loaded from DIR)``."""
        kept = self._prompt
        if kept is None or not (kept.kept_calls or kept.eager_calls):
            return ""
        parts = [f"compiled {kept.kept_calls}"] if kept.kept_calls else []
        if kept.eager_calls:
            parts.append(f"eager {kept.eager_calls}")
        why = (
            f"loaded from {self.settings.compile_cache}" if kept.kept_calls else "its package was not loaded"
        )
        if kept.failure is not None:
            why += f"; it failed: {type(kept.failure).__name__}"
        return f"prompt pass ran: {', '.join(parts)} ({why})"

    def ran(self) -> str:
        """Which one-row step ran for how many tokens so far, in words ("" when none was compiled):
        e.g. ``eager 12 tokens, then compiled 116 (compiled in this process)``."""
        step = self._one_token
        if step is None or not (step.eager_calls or step.compiled_calls or step.failure):
            return ""
        how = {"loaded": f"loaded from {self.settings.compile_cache}", "compiled": "compiled in this process"}
        parts = [f"eager {step.eager_calls} tokens"] if step.eager_calls else []
        if step.compiled_calls:
            parts.append(f"compiled {step.compiled_calls}")
        text = ", then ".join(parts) + f" ({how.get(step.source, 'not compiled')}"
        if step.failure is not None:
            text += f"; compiling failed: {type(step.failure).__name__}"
        elif step.pending:
            text += "; still compiling"
        store = getattr(step.builder, "__self__", None)
        if isinstance(store, StoredStep) and store.stored:
            text += f", kept in {self.settings.compile_cache}"
        if isinstance(store, StoredStep) and store.skipped:
            text += f"; {store.skipped}"
        return "one-row step ran: " + text + ")"

    @property
    def compiled_steps(self) -> list[Compiled]:
        """Every compiled step built for this model so far (the fused one, the frozen ones)."""
        built = [] if self._one_token is None else [self._one_token]
        return built + list(self.frozen.steps.values())

    def dynamic_session(
        self,
        plan: DecodePlan,
        max_batch: int,
        max_len: int | None = None,
        cache_dtype: torch.dtype | None = None,
        capacity: int | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> BatchSession:
        """A ``BatchSession`` that runs ``plan``'s step (the fused one-row step, or layer by layer),
        reading and filling ``prefix_cache`` if given (only the dynamic cache uses one), and, where the
        plan says ``lone_rows``, a step that feeds one row of several through the one-row step."""
        return BatchSession(
            self.model,
            max_batch,
            max_len,
            cache_dtype,
            capacity,
            one_token=self.one_row_step(plan),
            prompt=self.prompt_pass(plan),
            prefix_cache=prefix_cache,
            first_step=self.weights_on_huge_pages,
        )

    def one_row_step(self, plan: DecodePlan) -> Compiled | None:
        """The compiled one-row step where ``plan`` runs it (its step is the fused one, or it feeds
        ``lone_rows`` through it), else None: what a ``BatchSession`` for ``plan`` is given."""
        return self.one_token if plan.step == "fused" or plan.lone_rows else None

    def new_static_session(
        self,
        plan: DecodePlan,
        max_batch: int,
        max_len: int | None = None,
        cache_dtype: torch.dtype | None = None,
        vocab: int | None = None,
        slot_base: int = 0,
    ) -> StaticSession:
        """A ``StaticSession`` of its own (the server's lane) that runs ``plan``'s step."""
        return StaticSession(
            self.model,
            max_batch,
            max_len,
            cache_dtype,
            vocab,
            step=plan.step,
            compile_options=self.settings.compile_options,
            slot_base=slot_base,
            lookahead=self.settings.lookahead,
            frozen=self.frozen,
        )

    def static_session(
        self, plan: DecodePlan, batch: int, max_len: int, cache_dtype: torch.dtype | None, vocab: int
    ) -> StaticSession:
        """The model's static session if it is free and large enough, else a new (larger) one."""
        old = self.static
        if old is not None and not old.rows:
            fits = (
                old.max_batch >= batch
                and old.max_len >= max_len
                and old.vocab == vocab
                and (cache_dtype is None or old.cache.dtype == cache_dtype)
            )
            if fits:
                return old
            batch, max_len = max(batch, old.max_batch), max(max_len, old.max_len)
        rows = 1 << (batch - 1).bit_length()  # a power of two: later, smaller requests reuse it
        # a busy old session lives on with the stream that holds it
        self.static = self.new_static_session(plan, rows, max_len, cache_dtype, vocab)
        return self.static


def prepare_decoding(
    model: Decoder,
    *,
    compile: str | None = None,
    static: bool | None = None,
    planned_tokens: int | None = None,
    lookahead: int | None = None,
    compile_options: dict[str, object] | None = None,
    compile_cache: str | os.PathLike[str] | None = None,
    compile_wait: bool = True,
) -> PreparedDecoding:
    """Give ``model`` a new ``PreparedDecoding`` with these ``DecodeSettings`` (what they mean: there) → it.

    ``gptlab sample``, ``chat`` and ``serve`` call it with ``--compile`` and ``GPTLAB_STATIC``; in
    Python, ``prepare_decoding(model, compile="on")`` compiles the one-sequence CPU step and sends
    batches to the frozen step, ``prepare_decoding(model, static=True, compile="off")`` decodes
    through the static cache eagerly. Steps compiled under the previous engine are dropped.
    ``compile_cache=DIR`` keeps the compiled one-row step there for later processes (they load it
    instead of compiling); ``compile_wait=False`` compiles it in a background thread while the steps
    run eagerly, for machines with cores to spare (``DecodeSettings``).
    """
    cache = None if compile_cache is None else os.fspath(compile_cache)
    settings = DecodeSettings(
        compile, static, planned_tokens, lookahead, compile_options, cache, compile_wait
    )
    engine = PreparedDecoding(model, settings)
    setattr(model, ATTRIBUTE, engine)
    return engine


def prepared_of(model: Decoder) -> PreparedDecoding:
    """The engine ``prepare_decoding`` gave ``model``; a model never prepared gets the defaults now."""
    engine = getattr(model, ATTRIBUTE, None)
    if isinstance(engine, PreparedDecoding) and engine.model is model:
        return engine
    engine = PreparedDecoding(model)
    setattr(model, ATTRIBUTE, engine)
    return engine
