"""The fused one-row step, a decode step as one compiled graph (CPU, one sequence): ``decode_one_token``,
and the package that keeps it compiled (``StoredStep``).

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
Writes are atomic (``gptlab.fileio``). The exported copy of the model leaves out bf16 layers' oneDNN
prepacked copies (opaque tensors AOTInductor cannot take), which a compiled step never reads. A model
that AOTInductor cannot export otherwise is compiled by ``torch.compile`` in the process, as without
a store.

**Int8 matrices frozen** (``frozen_int8``: where bf16 is native, the int8 row goes through the library
kernel, ``_weight_int8pack_mm``). The package is compiled with ``FROZEN_INT8``: its weights are
constants, and inductor's C++ GEMM template packs each int8 matrix into blocks of ``b`` columns of Wᵀ,
``P[j, k, i] = W[j·b + i, k]`` (``blocked``), which its one-row kernel streams about twice as fast as
the library kernel reads W. Those blocks are not in the package either: while it compiles, each
constant inductor makes is recorded, traced by value to the model tensor it is the blocks of
(``_recipes``), and ``step.json`` keeps ``{constant: [tensor, b]}``; a loading process makes the blocks
from its live tensors, and blocks again a tensor written in place since (its version counter moved)
before the next step. Cost: one more copy of the int8 matrices, blocked, while the step is loaded (the
eager prefill reads the originals), and a compilation that autotunes each shape once.

**Never waited for** (``background=True``): the first call runs the eager step and starts the
compilation in a thread; decoding goes on eagerly until the compiled (or loaded) step is ready,
then switches (``Compiled.eager_calls`` / ``compiled_calls`` count the tokens of each).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import operator
import os
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import gptlab
from gptlab.compiling import Compiled, Job, load_package
from gptlab.fileio import atomic_write, atomic_write_json
from gptlab.generate.plan import Decoder, logits_of
from gptlab.model.kvcache import KVStore, KVView
from gptlab.model.quantized import Int8Linear, PackedBF16Linear

# ------------------------------------------------------------ fused_step
# Inductor inlines a cheap elementwise producer into each consumer. In front of a one-row
# product that would recompute a norm's output once per output channel (50,257 times for the
# head); realising every producer of more than a few operations computes it once.
_OPTIONS = {"realize_opcount_threshold": 10}
#: added for a kept step whose int8 matrices run through ``_weight_int8pack_mm`` (``frozen_int8``): the
#: weights become constants of the graph and inductor's C++ GEMM template multiplies the row by each
#: matrix packed once into blocks of columns, ``P[j, k, i] = W[j·b + i, k]``, which it streams about
#: twice as fast as the library kernel reads W (docs/benchmarks.md, "Int8 weights in a kept step")
FROZEN_INT8 = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


def frozen_int8(model: Decoder) -> bool:
    """Whether ``model``'s kept step freezes its weights (``FROZEN_INT8``): some int8 matrix of it is
    multiplied by the library kernel on a CPU (``Int8Linear._compiled_row``: bf16 activations)."""
    return isinstance(model, nn.Module) and any(
        isinstance(m, Int8Linear) and m.library_row and m.weight.device.type == "cpu" for m in model.modules()
    )


def blocked(w: torch.Tensor, block: int) -> torch.Tensor:
    """A matrix (N, K) as blocks of ``block`` columns of Wᵀ, (⌈N/b⌉, K, b): ``P[j, k, i] = W[j·b + i, k]``,
    zero past row N; what inductor's GEMM template packs a frozen weight into."""
    n, k = w.shape
    padded = torch.zeros(k, n + (-n % block), dtype=w.dtype, device=w.device)
    padded[:, :n] = w.t()
    return padded.view(k, -1, block).transpose(0, 1).contiguous()


_RECORDING = threading.Lock()


@contextlib.contextmanager
def _constants_made(made: dict[str, torch.Tensor]) -> Iterator[None]:
    """Records each constant inductor adds to a graph while it compiles (a frozen weight it packed),
    by name, so that the kept step's record can say how to make it again from the model's own."""
    from torch._inductor.graph import GraphLowering

    with _RECORDING:  # one compilation records at a time: the method is restored as it was found
        add = GraphLowering.add_tensor_constant

        def recorded(self: GraphLowering, data: torch.Tensor, name: str | None = None) -> Any:
            box = add(self, data, name)
            made[box.get_name()] = data
            return box

        GraphLowering.add_tensor_constant = recorded  # type: ignore[method-assign]
        try:
            yield
        finally:
            GraphLowering.add_tensor_constant = add  # type: ignore[method-assign]


def _recipes(
    names: list[str], made: dict[str, torch.Tensor], own: dict[str, torch.Tensor]
) -> dict[str, list[Any]]:
    """For each constant of a frozen package that is not one of the model's own tensors: ``[fqn, b]``,
    the model tensor it is ``blocked(own[fqn], b)`` of, found by value; ValueError for one not found."""
    recipes: dict[str, list[Any]] = {}
    for name in names:
        if name in own:
            continue
        data = made.get(name)
        if data is None or data.dim() != 3:
            raise ValueError(f"the frozen step's constant {name} is not a packed matrix")
        rows, k, block = data.shape
        for fqn, w in own.items():
            if (
                w.dim() == 2
                and w.dtype == data.dtype
                and w.size(1) == k
                and -(-w.size(0) // block) == rows
                and torch.equal(w[0], data[0, :, 0])  # (a first row that differs rules it out cheaply)
                and torch.equal(blocked(w, block), data)
            ):
                recipes[name] = [fqn, block]
                break
        else:
            raise ValueError(f"the frozen step's constant {name} is no blocked matrix of the model's")
    return recipes


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
FORMAT = 2
PACKAGE, RECORD = "step.pt2", "step.json"
# the sources whose code the exported step runs: a change to any of them is a new key
_SOURCES = ("model", "generate/one_token.py", "generate/plan.py", "generate/prompt_pass.py")


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


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a kept package computes: the one-row step (``STEP``) or a prompt's pass
    (``gptlab.generate.prompt_pass.PROMPT``). Both live in one folder per model and machine (the
    step's key), as ``NAME.pt2`` and its record ``NAME.json``.

    ``wrapper``: the function as a module to export (its tensors are the model's, under ``m.``);
    ``examples(model, keys)``: the arguments to export it with, from the caller's cache (None where
    it does not apply to this model); ``shapes(model, layers)``: which of their sizes are symbols;
    ``loaded(package, model, derived)``: the package as the function's signature; ``freezes``:
    whether its int8 matrices may be frozen (``FROZEN_INT8``)."""

    name: str
    wrapper: Callable[[Decoder], nn.Module]
    examples: Callable[[Decoder, list[torch.Tensor]], tuple[Any, ...] | None]
    shapes: Callable[[Decoder, int], dict[str, Any]]
    loaded: Callable[[Path, Decoder, dict[str, list[Any]]], Callable[..., Any]]
    freezes: bool = False

    @property
    def package(self) -> str:
        return f"{self.name}.pt2"

    @property
    def record(self) -> str:
        return f"{self.name}.json"

    def kept_in(self, folder: Path) -> bool:
        """Whether ``folder`` holds this kind's package and its record (``StoredStep.load`` verifies them)."""
        return (folder / self.record).is_file() and (folder / self.package).is_file()


def _step_examples(model: Decoder, keys: list[torch.Tensor]) -> tuple[Any, ...]:
    n_kv, d_k, dtype = keys[0].size(1), keys[0].size(3), keys[0].dtype
    return (
        torch.tensor([[0]]),
        torch.tensor([1]),
        [torch.zeros(1, n_kv, 8, d_k, dtype=dtype) for _ in keys],
        [torch.zeros(1, n_kv, 8, d_k, dtype=dtype) for _ in keys],
        torch.empty(2),
    )


def _step_shapes(model: Decoder, layers: int) -> dict[str, Any]:
    from torch.export import Dim

    capacity, end = Dim("capacity", min=2, max=1 << 24), Dim("end", min=1, max=1 << 24)
    return {
        "idx": None,
        "pos": None,
        "keys": [{2: capacity}] * layers,
        "values": [{2: capacity}] * layers,
        "span": {0: end},
    }


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
    ones while the original keeps decoding. A compiled step never reads a bf16 layer's oneDNN copy
    (an opaque tensor AOTInductor cannot take; its one row is ``_compiled_row``): the copy drops it."""
    memo: dict[int, Any] = {}
    for module in model.modules():  # type: ignore[attr-defined]
        for t in _tensors(module).values():
            memo[id(t)] = t
    twin = copy.deepcopy(model, memo)
    for module in twin.modules():  # type: ignore[attr-defined]
        if isinstance(module, PackedBF16Linear) and module.packed is not None:
            module._buffers["packed"] = None
    return twin


class StoredStep:
    """A package kept in ``root`` (the one-row step, or another ``Kind``): ``load(args)`` and
    ``build(args)`` for ``Compiled``, whose ``args`` begin ``(model, idx, pos, keys, values)``."""

    def __init__(self, root: Path, kind: Kind | None = None) -> None:
        self.root = root
        self.kind = STEP if kind is None else kind
        self.skipped = ""  # why the step was compiled in the process instead (not storable)
        self.stored = False  # this process compiled it into the store

    def key(self, model: Decoder, cache_dtype: torch.dtype) -> dict[str, Any]:
        """What the compiled code depends on (the module docstring); another kind than the step's
        names itself."""
        config = getattr(model, "config", None)
        key = {
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
            "options": self.options(model),
        }
        if self.kind is not STEP:
            key["kind"] = self.kind.name
        return key

    def options(self, model: Decoder) -> dict[str, Any]:
        """The inductor settings it is compiled with: ``_OPTIONS``, and ``FROZEN_INT8`` for the step of a
        ``frozen_int8`` model."""
        return {**_OPTIONS, **(FROZEN_INT8 if self.kind.freezes and frozen_int8(model) else {})}

    def folder(self, key: dict[str, Any]) -> Path:
        """The folder of the step with this key (every kind of the same model and machine is kept there)."""
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        return self.root / digest[:32]

    def place(self, model: Decoder, cache_dtype: torch.dtype) -> Path:
        """Where ``model``'s packages over a cache of ``cache_dtype`` are kept: the step's folder."""
        step = self if self.kind is STEP else StoredStep(self.root)
        return self.folder(step.key(model, cache_dtype))

    def kept(self, model: Decoder, cache_dtype: torch.dtype) -> bool:
        """Whether the store holds this kind's package for ``model`` (a record beside it; ``load`` verifies)."""
        return self.kind.kept_in(self.place(model, cache_dtype))

    def load(self, args: tuple[Any, ...]) -> Callable[..., Any] | None:
        """The stored package for these arguments' model and cache, verified; None when there is none
        (or it is damaged or foreign: a warning, and it is compiled again)."""
        model, keys = args[0], args[3]
        key = self.key(model, keys[0].dtype)
        folder = self.place(model, keys[0].dtype)
        if not (folder / self.kind.record).exists():
            return None
        try:
            record = json.loads((folder / self.kind.record).read_text())
            recorded = json.loads(json.dumps(key, default=str))
            if record.get("key") != recorded:
                raise ValueError("its key is not this model's, CPU's or torch's")
            if _sha256(folder / self.kind.package) != record.get("sha256"):
                raise ValueError("its sha256 differs from the one recorded")
            return self.kind.loaded(folder / self.kind.package, model, record.get("derived", {}))
        except (OSError, ValueError, RuntimeError, AttributeError, TypeError) as exc:
            if self.kind is STEP:
                what, then = "decode step", "compiling it again"
            else:  # (nothing compiles it in a process: ``gptlab compile`` replaces it)
                what, then = f"{self.kind.name} pass", "running the eager pass (gptlab compile replaces it)"
            warnings.warn(f"the stored {what} in {folder} is not used ({exc}); {then}", stacklevel=2)
            return None

    def build(self, args: tuple[Any, ...]) -> Job | None:
        """Export and compile the package into the store (a job, for a thread), then load it; None
        where it cannot be exported (the step: ``torch.compile`` then compiles it in the process)."""
        model, keys = args[0], list(args[3])
        twin = self.kind.wrapper(_shared_copy(model))
        key = self.key(model, keys[0].dtype)

        def job() -> Callable[..., Any] | None:
            # (made here, outside the caller's inference mode: AOTInductor runs them as ordinary tensors)
            examples = self.kind.examples(model, keys)
            try:
                if examples is None:
                    raise ValueError(f"no {self.kind.name} pass applies to this model")
                return self._compile(twin, examples, key, model)
            except Exception as exc:  # export or AOTInductor cannot take this model
                self.skipped = (
                    f"not stored: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
                return None

        return job

    def _compile(
        self, twin: nn.Module, examples: tuple[Any, ...], key: dict[str, Any], model: Decoder
    ) -> Callable[..., Any]:
        """Export ``twin``, compile it into the store (package, then its record), load it for ``model``."""
        folder, kind = self.place(model, examples[2][0].dtype), self.kind
        shapes = kind.shapes(model, len(examples[2]))
        with torch.inference_mode():
            program = torch.export.export(twin, examples, dynamic_shapes=shapes, strict=False)
        folder.mkdir(parents=True, exist_ok=True)
        built = folder / f".{kind.package}.{os.getpid()}.{uuid.uuid4().hex}.pt2"
        try:
            from torch._inductor import aoti_compile_and_package

            # every constant the package reads is the live model's (user-managed): inductor keeps each
            # tensor it meets as the module's named tensor rather than inlining small ones (an int4
            # layer's group size) into constants of its own, which a package without weights lacks
            options = {
                **self.options(model),
                "aot_inductor.package_constants_in_so": False,
                "always_keep_tensor_constants": True,
            }
            made: dict[str, torch.Tensor] = {}  # the matrices a frozen step packed, by constant name
            with warnings.catch_warnings(), _constants_made(made):
                # torch deprecating its own internals while it copies the program (LeafSpec) is
                # not the user's business
                warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")
                aoti_compile_and_package(program, package_path=str(built), inductor_configs=options)
            live = kind.wrapper(model)  # (the names the package reads its constants by)
            own: dict[str, torch.Tensor] = dict(live.named_parameters(remove_duplicate=False))
            own.update(live.named_buffers(remove_duplicate=False))
            derived = _recipes(load_package(built).get_constant_fqns(), made, own)
            digest = _sha256(built)
            atomic_write(folder / kind.package, lambda tmp: os.replace(built, tmp))
        finally:
            built.unlink(missing_ok=True)
        record = {"key": key, "sha256": digest, "file": kind.package, "derived": derived}
        atomic_write_json(folder / kind.record, record)
        self.stored = True
        return kind.loaded(folder / kind.package, model, derived)


def _version(t: torch.Tensor) -> int:
    """``t``'s version counter (−1 for an inference-mode tensor, which keeps none)."""
    try:
        return int(t._version)
    except RuntimeError:
        return -1


def load_reading(
    package: Path, wrapper: nn.Module, derived: dict[str, list[Any]]
) -> tuple[Any, dict[str, torch.Tensor]]:
    """An AOTInductor package's loader whose constants are ``wrapper``'s own tensors (user-managed:
    nothing copied) and, for ``derived`` ones, the blocks made from them (``_recipes``) → (loader, constants)."""
    loader = load_package(package)
    constants = {}
    for name in loader.get_constant_fqns():
        if name in derived:
            fqn, block = derived[name]
            constants[name] = blocked(operator.attrgetter(fqn)(wrapper), int(block))
        else:
            constants[name] = operator.attrgetter(name)(wrapper)
    loader.load_constants(constants, False, True, True)  # (not on device, check all, user-managed)
    return loader, constants


def _loaded(package: Path, model: Decoder, derived: dict[str, list[Any]]) -> Callable[..., Any]:
    """The AOTInductor package as ``decode_one_token``'s signature, reading ``model``'s own tensors;
    ``derived``: a frozen step's packed matrices, made from the model's (``_recipes``)."""
    wrapper = _Step(model)
    loader, constants = load_reading(package, wrapper, derived)
    span = torch.empty(0)
    # the blocks are copies: a source written in place since (its version moved) is blocked again,
    # into the same tensors the package reads, before the next step (an inference-mode tensor keeps
    # no version: not followed)
    sources = [
        (constants[name], operator.attrgetter(fqn)(wrapper), int(block))
        for name, (fqn, block) in derived.items()
    ]
    sources = [source for source in sources if _version(source[1]) >= 0]
    weights = [w for _, w, _ in sources]
    seen = [w._version for w in weights]
    total = sum(seen)  # versions only grow: an unchanged sum is no change (one pass a step)

    def step(
        m: Decoder,
        idx: torch.Tensor,
        pos: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        end: int,
    ) -> torch.Tensor:
        nonlocal span, total
        if m is not model or keys[0].size(2) < 2:  # outside what was exported: the eager step
            return decode_one_token(m, idx, pos, keys, values, end)
        if span.numel() < end:
            span = torch.empty(max(2 * end, 64))
        if sum(w._version for w in weights) != total:
            for i, (blocks, w, block) in enumerate(sources):
                if w._version != seen[i]:
                    blocks.copy_(blocked(w, block))
                    seen[i] = w._version
            total = sum(seen)
        out: torch.Tensor = loader.boxed_run([idx, pos, *keys, *values, span[:end]])[0]
        return out

    step.constants = constants  # type: ignore[attr-defined]  # kept alive: the loader reads them
    return step


#: the one-row step as a kept package
STEP = Kind("step", _Step, _step_examples, _step_shapes, _loaded, freezes=True)
