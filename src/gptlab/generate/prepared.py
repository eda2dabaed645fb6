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

The fused step, a decode step as one compiled graph (CPU, one sequence): ``decode_one_token``.

A decode step of gpt2 runs ~300 small operations: 48 one-row matrix products and, around
them, norms, views, the cache write and read, attention and residual adds. Run one by one,
the Python and dispatch between them cost about as much as the products
(docs/benchmarks.md#decoding). ``decode_one_token`` is that whole step,

    write k_t, v_t at cache index t = end − 1;   attend over K, V[0, end);   logits_t

written over plain tensors (the session's cache rows) and an ``end`` that ``torch.compile``
treats as a symbol, so one graph serves every length and nothing recompiles as the cache
fills. Inside it each ``InferenceLinear`` inlines its ``gemv`` and inductor fuses the step
into a dozen kernels per layer.

``one_token_step()`` wraps it in a ``Compiled``; the model's ``PreparedDecoding``
(``gptlab.generate.prepared``) holds that one object, so every session of the model reuses the
graph. ``plan_decoding`` decides when it runs: a session of one row on a CPU with a float KV cache.
Its logits equal the layer-by-layer path's (tested).

**Paid for once per machine and model** (``one_token_step(store=DIR)``): the step is exported
(``torch.export``, the cache length and capacity as symbols) and compiled ahead of time by
AOTInductor into a package, ``DIR/<key>/step.pt2``, that a later process loads in milliseconds
(``torch._C._aoti.AOTIModelPackageLoader``) instead of compiling again. The weights are not in
the package: the loaded step reads the live model's tensors (``load_constants``, user-managed), so
the key is what the compiled code depends on, not the weights' values: torch's version, the
CPU's capability (``torch.backends.cpu.get_cpu_capability()``), the thread count inductor wrote
into its loops, the source of gptlab's model and of this step, the model's config, the module
tree with each tensor's name, dtype, shape and stride (the weight format, ``streams``), the cache
dtype and the inductor options. ``step.json`` beside the package records that key and the
package's sha256, as a checkpoint's ``checksums.json`` does; a package whose record is missing,
foreign or whose checksum differs is not loaded (a warning; it is compiled again and replaced).
Writes are atomic (``gptlab.fileio``). A model that AOTInductor cannot export (bf16 matrices
multiplied through oneDNN's prepacked copies, in a model too small to stream its weights) is
compiled by ``torch.compile`` in the process, as without a store.

**Never waited for** (``background=True``): the first call runs the eager step and starts the
compilation in a thread; decoding goes on eagerly until the compiled (or loaded) step is ready,
then switches (``Compiled.eager_calls`` / ``compiled_calls`` count the tokens of each).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import operator
import os
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import gptlab
from gptlab.compiling import Compiled, Job, load_package
from gptlab.fileio import atomic_write, atomic_write_json
from gptlab.generate.config import SampleConfig
from gptlab.generate.plan import DecodePlan, Decoder, DecodeSettings, ModelFacts, logits_of, plan_decoding
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.session import BatchSession
from gptlab.generate.static import FrozenSteps, StaticSession
from gptlab.hardware import keep_heap
from gptlab.model.kvcache import KVStore, KVView, default_cache_dtype
from gptlab.model.quantized import PackedBF16Linear

#: the model attribute that holds its engine
ATTRIBUTE = "decode_engine"
#: steps whose static sessions compile (the rest run the same step eagerly)


class PreparedDecoding:
    """The decode settings of one model and everything compiled for it (see the module docstring)."""

    def __init__(self, model: Decoder, settings: DecodeSettings | None = None) -> None:
        self.model = model
        self.settings = settings or DecodeSettings()
        if model.device.type == "cpu":
            keep_heap()  # an eager prefill's blocks reused, not page-faulted afresh (gptlab.hardware)
        self.frozen = FrozenSteps(model)  # the frozen CPU steps, one per sampler flavour
        self._one_token: Compiled | None = None
        #: the static session later requests reuse while it is free and large enough
        self.static: StaticSession | None = None
        self._folders: dict[torch.dtype, Path] = {}

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
            facts = dataclasses.replace(facts, kept_step=self.step_kept(cache_dtype))
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
        return folder is not None and (folder / RECORD).is_file() and (folder / PACKAGE).is_file()

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
            prefix_cache=prefix_cache,
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


# ------------------------------------------------------------ fused_step
# Inductor inlines a cheap elementwise producer into each consumer. In front of a one-row
# product that would recompute a norm's output once per output channel (50,257 times for the
# head); realising every producer of more than a few operations computes it once.
_OPTIONS = {"realize_opcount_threshold": 10}


def decode_one_token(
    model: Decoder,
    idx: torch.Tensor,  # (1, 1) the new token
    pos: torch.Tensor,  # (1,) its position
    keys: list[torch.Tensor],  # per layer (1, H_kv, T_max, d_k)
    values: list[torch.Tensor],
    end: int,  # cached positions after this step
) -> torch.Tensor:
    """Next-token logits (1, vocab) float32 after appending ``idx`` at cache index ``end − 1``."""
    # each layer: write at cache index end − 1, attend over [0, end)
    cache = [KVView(KVStore(k, v), write=end - 1, end=end) for k, v in zip(keys, values, strict=True)]
    out = model.run(idx, pos=pos, cache=cache, last_only=True)
    return logits_of(out)[:, -1].float()


def one_token_step(store: str | os.PathLike[str] | None = None, background: bool = False) -> Compiled:
    """``decode_one_token`` compiled at its first call, one graph for every length: through
    ``torch.compile``, or, with a ``store`` directory, loaded from it or compiled ahead of time
    into it (the module docstring); ``background``: meanwhile decode eagerly."""
    stored = None if store is None else StoredStep(Path(store))
    return Compiled(
        decode_one_token,
        "the compiled decode step",
        dynamic=True,
        options=_OPTIONS,
        load=None if stored is None else stored.load,
        build=None if stored is None else stored.build,
        background=background,
    )


#: the version of the stored artefact's layout (a change makes every older one foreign)
FORMAT = 1
PACKAGE, RECORD = "step.pt2", "step.json"
# the sources whose code the exported step runs: a change to any of them is a new key
_SOURCES = ("model", "generate/prepared.py", "generate/plan.py")


class _Step(nn.Module):
    """``decode_one_token`` as a module to export: ``span``'s length is the cache's ``end``."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.m = model

    def forward(
        self,
        idx: torch.Tensor,
        pos: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        span: torch.Tensor,
    ) -> torch.Tensor:
        return decode_one_token(self.m, idx, pos, keys, values, span.size(0))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _code_digest() -> str:
    root, h = Path(gptlab.__file__).parent, hashlib.sha256()
    for name in _SOURCES:
        for path in sorted((root / name).rglob("*.py")) if (root / name).is_dir() else [root / name]:
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """A module's own tensors: parameters, buffers and tensor attributes (oneDNN's packed copies)."""
    own = {**module._parameters, **module._buffers}
    own.update((k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor))
    return {k: v for k, v in own.items() if v is not None}


def _structure(model: nn.Module) -> str:
    """The module tree, each module's class and ``streams`` flag, each tensor's dtype, shape, stride."""
    lines = []
    for name, module in model.named_modules():
        lines.append(
            f"{name} {type(module).__module__}.{type(module).__qualname__} {getattr(module, 'streams', '')}"
        )
        for key, t in sorted(_tensors(module).items()):
            stride = tuple(t.stride()) if t.layout == torch.strided else str(t.layout)
            lines.append(f"  {key} {t.dtype} {tuple(t.shape)} {stride}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _shared_copy(model: Decoder) -> Decoder:
    """A copy of the module tree sharing every tensor: export swaps the copy's parameters for fake
    ones while the original keeps decoding. A module that streams its weights never reads its
    oneDNN copy (an opaque tensor AOTInductor cannot take): the copy drops it."""
    memo: dict[int, Any] = {}
    for module in model.modules():  # type: ignore[attr-defined]
        for t in _tensors(module).values():
            memo[id(t)] = t
    twin = copy.deepcopy(model, memo)
    for module in twin.modules():  # type: ignore[attr-defined]
        if isinstance(module, PackedBF16Linear) and module.streams and module.packed is not None:
            module._buffers["packed"] = None
    return twin


class StoredStep:
    """The compiled one-row step kept in ``root``: ``load(args)`` and ``build(args)`` for ``Compiled``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.skipped = ""  # why the step was compiled in the process instead (not storable)
        self.stored = False  # this process compiled it into the store

    def key(self, model: Decoder, cache_dtype: torch.dtype) -> dict[str, Any]:
        """What the compiled code depends on (the module docstring)."""
        config = getattr(model, "config", None)
        return {
            "format": FORMAT,
            "torch": torch.__version__,
            "cpu": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "code": _code_digest(),
            "config": (
                dataclasses.asdict(config)
                if dataclasses.is_dataclass(config) and not isinstance(config, type)
                else repr(config)
            ),
            "modules": _structure(model) if isinstance(model, nn.Module) else repr(model),
            "cache": str(cache_dtype),
            "options": _OPTIONS,
        }

    def folder(self, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        return self.root / digest[:32]

    def load(self, args: tuple[Any, ...]) -> Callable[..., Any] | None:
        """The stored step for these arguments' model and cache, verified; None when there is none
        (or it is damaged or foreign: a warning, and it is compiled again)."""
        model, keys = args[0], args[3]
        key = self.key(model, keys[0].dtype)
        folder = self.folder(key)
        if not (folder / RECORD).exists():
            return None
        try:
            record = json.loads((folder / RECORD).read_text())
            recorded = json.loads(json.dumps(key, default=str))
            if record.get("key") != recorded:
                raise ValueError("its key is not this model's, CPU's or torch's")
            if _sha256(folder / PACKAGE) != record.get("sha256"):
                raise ValueError("its sha256 differs from the one recorded")
            return _loaded(folder / PACKAGE, model)
        except (OSError, ValueError, RuntimeError, AttributeError) as exc:
            warnings.warn(
                f"the stored decode step in {folder} is not used ({exc}); compiling it again", stacklevel=2
            )
            return None

    def build(self, args: tuple[Any, ...]) -> Job | None:
        """Export and compile the step into the store (a job, for a thread), then load it; None
        where the step cannot be exported (``torch.compile`` then compiles it in the process)."""
        model, keys = args[0], args[3]
        twin = _Step(_shared_copy(model))
        if any(isinstance(m, PackedBF16Linear) and m.packed is not None for m in twin.modules()):
            self.skipped = "oneDNN's prepacked bf16 weights cannot be exported"
            return None
        key = self.key(model, keys[0].dtype)
        n_kv, d_k, dtype, layers = keys[0].size(1), keys[0].size(3), keys[0].dtype, len(keys)

        def job() -> Callable[..., Any] | None:
            # (made here, outside the caller's inference mode: AOTInductor runs them as ordinary tensors)
            examples = (
                torch.tensor([[0]]),
                torch.tensor([1]),
                [torch.zeros(1, n_kv, 8, d_k, dtype=dtype) for _ in range(layers)],
                [torch.zeros(1, n_kv, 8, d_k, dtype=dtype) for _ in range(layers)],
                torch.empty(2),
            )
            try:
                return self._compile(twin, examples, key, model)
            except Exception as exc:  # export or AOTInductor cannot take this model
                self.skipped = (
                    f"not stored: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
                return None

        return job

    def _compile(
        self, twin: _Step, examples: tuple[Any, ...], key: dict[str, Any], model: Decoder
    ) -> Callable[..., Any]:
        """Export ``twin``, compile it into the store (package, then its record), load it for ``model``."""
        from torch.export import Dim

        folder, layers = self.folder(key), len(examples[2])
        capacity, end = Dim("capacity", min=2, max=1 << 24), Dim("end", min=1, max=1 << 24)
        shapes = {
            "idx": None,
            "pos": None,
            "keys": [{2: capacity}] * layers,
            "values": [{2: capacity}] * layers,
            "span": {0: end},
        }
        with torch.inference_mode():
            program = torch.export.export(twin, examples, dynamic_shapes=shapes, strict=False)
        folder.mkdir(parents=True, exist_ok=True)
        built = folder / f".{PACKAGE}.{os.getpid()}.{uuid.uuid4().hex}.pt2"
        try:
            from torch._inductor import aoti_compile_and_package

            # every constant the package reads is the live model's (user-managed): inductor keeps each
            # tensor it meets as the module's named tensor rather than inlining small ones (an int4
            # layer's group size) into constants of its own, which a package without weights lacks
            options = {
                **_OPTIONS,
                "aot_inductor.package_constants_in_so": False,
                "always_keep_tensor_constants": True,
            }
            with warnings.catch_warnings():
                # torch deprecating its own internals while it copies the program (LeafSpec) is
                # not the user's business
                warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")
                aoti_compile_and_package(program, package_path=str(built), inductor_configs=options)
            digest = _sha256(built)
            atomic_write(folder / PACKAGE, lambda tmp: os.replace(built, tmp))
        finally:
            built.unlink(missing_ok=True)
        atomic_write_json(folder / RECORD, {"key": key, "sha256": digest, "file": PACKAGE})
        self.stored = True
        return _loaded(folder / PACKAGE, model)


def _loaded(package: Path, model: Decoder) -> Callable[..., Any]:
    """The AOTInductor package as ``decode_one_token``'s signature, reading ``model``'s own tensors."""
    loader = load_package(package)
    wrapper = _Step(model)
    constants = {name: operator.attrgetter(name)(wrapper) for name in loader.get_constant_fqns()}
    loader.load_constants(constants, False, True, True)  # (not on device, check all, user-managed)
    span = torch.empty(0)

    def step(
        m: Decoder,
        idx: torch.Tensor,
        pos: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        end: int,
    ) -> torch.Tensor:
        nonlocal span
        if m is not model or keys[0].size(2) < 2:  # outside what was exported: the eager step
            return decode_one_token(m, idx, pos, keys, values, end)
        if span.numel() < end:
            span = torch.empty(max(2 * end, 64))
        out: torch.Tensor = loader.boxed_run([idx, pos, *keys, *values, span[:end]])[0]
        return out

    step.constants = constants  # type: ignore[attr-defined]  # kept alive: the loader reads them
    return step
