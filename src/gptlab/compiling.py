"""When ``torch.compile`` can run here, and a compiled function that falls back to eager when it cannot.

On a CPU, inductor (``torch.compile``'s default back-end) writes C++ and builds it with the
machine's compiler; on CUDA it writes Triton. ``Compiled(fn)`` compiles lazily on first use
and, where no compiler is found or compilation fails, warns once and keeps calling ``fn``
itself, so a compiled path is only ever faster, never an error. The first call of each
compiles, which takes seconds on a cold cache (inductor keeps its results on disk).

Two process-wide settings, given by the caller and read nowhere else (the library reads no
environment variable: the CLI turns ``GPTLAB_COMPILE=0`` and ``$CXX`` into them):
``configure(compile=False)`` runs every ``Compiled`` eagerly and makes ``can_compile`` say no, so
the decode plan says so too; ``configure(cxx="clang++")`` names the C++ compiler inductor uses.

``probe_cpu_isa_early(device)``: inductor's per-process check of the CPU's vector instructions,
started in a thread by a process that will compile.

``load_package(path)``: an AOTInductor package's loader, the folder it unpacks into removed once loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
import threading
import types
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPILE_FAILED = "torch.compile failed"  # in the warning; pytest turns it into an error (pyproject.toml)


@dataclass(frozen=True)
class Toolchain:
    """The process-wide compile settings (``configure``): whether to compile at all, and with which C++ compiler."""

    compile: bool = True
    cxx: str | None = None  # None: the first of g++, clang++, c++ on the PATH


_toolchain = Toolchain()


def configure(*, compile: bool = True, cxx: str | None = None) -> Toolchain:
    """Set the process-wide compile settings (the module docstring) → the previous ones.

    ``compile=False`` turns every ``Compiled`` of the project off, those built before the call
    included (the one-row kernels of ``gptlab.model.quantized`` are built at import).
    """
    global _toolchain
    previous, _toolchain = _toolchain, Toolchain(compile, cxx)
    return previous


def toolchain() -> Toolchain:
    """The settings ``configure`` last set (the defaults if it was never called)."""
    return _toolchain


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use (``configure``'s ``cxx``, else g++, clang++ or c++), or None."""
    names = (_toolchain.cxx,) if _toolchain.cxx else ("g++", "clang++", "c++")
    return next((c for c in names if shutil.which(c)), None)


def compile_blocker(device_type: str) -> str | None:
    """Why ``torch.compile`` cannot generate kernels for ``device_type`` here, or None."""
    if not _toolchain.compile:
        return "compiling switched off (compiling.configure(compile=False): GPTLAB_COMPILE=0)"
    if device_type == "cpu" and cxx_compiler() is None:
        return "no C++ compiler for torch.compile (install g++ or name one: CXX)"
    return None


def can_compile(device_type: str) -> bool:
    """True where ``torch.compile`` can generate kernels for ``device_type`` (``compile_blocker`` is None)."""
    return compile_blocker(device_type) is None


def probe_cpu_isa_early(device_type: str) -> threading.Thread | None:
    """Start inductor's CPU vector-ISA probe in a daemon thread → the thread, or None where nothing compiles.

    Before a process loads or builds its first C++ kernel, inductor asks which vector instruction
    sets both the CPU and the compiler handle. For each candidate it builds a small library and
    loads it in a child Python process, one after another: about 1.3 s on a 2-core CPU, paid once
    per process even when every kernel then comes from inductor's on-disk cache. The answer is kept
    for the process (``functools.cache``). A process that knows it will compile (a training run with
    ``compile=true``) starts the probe here, so that it runs while the model is built and Dynamo
    traces it, not inside the first step. Should the main thread need the answer first, it probes
    as well: the same answer, found twice.
    """
    if device_type != "cpu" or not can_compile(device_type):
        return None
    from torch._inductor import cpu_vec_isa

    thread = threading.Thread(target=cpu_vec_isa.valid_vec_isa_list, name="gptlab-isa-probe", daemon=True)
    thread.start()
    return thread


#: what ``Compiled``'s ``build(args)`` returns: a job that makes the compiled function, or None
#: where it cannot (``torch.compile`` then makes it)
Job = Callable[[], Callable[..., Any] | None]


class Compiled:
    """``fn`` through ``torch.compile``, or ``fn`` itself.

    ``dynamic=True`` compiles one kernel for every shape (sizes are symbols), which also keeps
    a function called with many shapes under dynamo's recompilation limit; ``distinct_sizes``
    keeps each size its own symbol (dynamo otherwise ties sizes that are equal at the first call,
    say a batch and a cache's rows, and recompiles when they part). ``options`` are
    inductor settings for this function only, passed to ``torch.compile``; ``patch`` inductor
    settings that must hold while it compiles (``freezing`` is read outside ``options``' reach),
    set around every call; ``settings`` other ``torch.compile`` arguments
    (``mode="reduce-overhead"`` captures CUDA graphs, ``fullgraph=True``, a ``backend``).
    ``enabled=False`` (or ``device_type`` without a compiler, or ``configure(compile=False)``, even
    after this object was built) runs ``fn`` itself.

    How the compiled form is made, at the first call (``args``: that call's arguments):

    * ``load(args)`` (optional): a compiled form kept from an earlier process, or None; ``source``
      is then ``"loaded"`` and nothing compiles;
    * ``build(args)`` (optional): called at once, it returns a job that makes the compiled form
      (by default, and where ``build`` or its job gives None: ``torch.compile``, in the background
      run once on copies of ``args``); ``source`` is ``"compiled"``.
    * ``background=True``: the job runs in a thread while calls keep running ``fn`` (counted in
      ``eager_calls``); the call after it finishes switches to the compiled form. The thread
      starts after the first (eager) call returns, so what that call compiles (the one-row
      kernels) is not compiled twice at once. Without ``background`` the first call waits.

    A compilation that fails turns the compiled path off for good, with a warning; ``failure``
    keeps the exception and ``compiled_calls`` counts the calls that ran compiled, so a test (or a
    benchmark) can tell the compiled path from its eager fallback.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        what: str,
        dynamic: bool = False,
        options: dict[str, Any] | None = None,
        *,
        patch: dict[str, Any] | None = None,
        distinct_sizes: bool = False,
        device_type: str = "cpu",
        enabled: bool = True,
        load: Callable[[tuple[Any, ...]], Callable[..., Any] | None] | None = None,
        build: Callable[[tuple[Any, ...]], Job | None] | None = None,
        background: bool = False,
        **settings: Any,
    ) -> None:
        if isinstance(fn, types.FunctionType):
            # dynamo keeps compiled graphs (and its limit of recompilations) per code object: a
            # private copy of fn's code gives every Compiled its own (a module is compiled as itself)
            own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__)
            own.__kwdefaults__, own.__doc__ = fn.__kwdefaults__, fn.__doc__
            fn = own
        self.fn, self.what, self.dynamic, self.options = fn, what, dynamic, options
        self.patch, self.distinct_sizes = patch, distinct_sizes
        self._compiled: Callable[..., Any] | None = None
        self.settings = settings  # more torch.compile arguments: mode, fullgraph, backend
        self._enabled = enabled and can_compile(device_type)
        self.loader, self.builder, self.background = load, build, background
        self._thread: threading.Thread | None = None
        self._built: Callable[..., Any] | None = None  # what the thread made
        self._error: Exception | None = None  # what the thread raised
        self.compiled_calls = 0
        self.eager_calls = 0  # calls that ran ``fn`` while the compiled form was being made
        self.source = ""  # "loaded" | "compiled", once there is a compiled form
        self.failure: Exception | None = None

    @property
    def enabled(self) -> bool:
        """True while calls go through ``torch.compile`` (not switched off, no failure yet)."""
        return self._enabled and _toolchain.compile

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._enabled = on

    @property
    def pending(self) -> bool:
        """True while a background compilation runs."""
        return self._thread is not None and self._compiled is None and self.failure is None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background compilation (tests, benchmarks) → True when it has finished."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def __call__(self, *args: Any) -> Any:
        if not self.enabled:
            return self.fn(*args)
        try:
            if self._compiled is None:
                self._compiled = self._ready(args)
        except Exception as exc:  # a missing header, a broken toolchain: keep working, uncompiled
            self._fail(exc)
            return self.fn(*args)
        if self._compiled is None:  # compiling in the background: this call runs eagerly
            self.eager_calls += 1
            out = self.fn(*args)
            if self._thread is None:
                try:
                    self._start(args)
                except Exception as exc:
                    self._fail(exc)
            return out
        try:
            if self.source == "loaded":  # an ahead-of-time package: nothing compiles, nothing to hold
                out = self._compiled(*args)
            else:
                with self.held_settings():
                    out = self._compiled(*args)
        except Exception as exc:  # a missing header, a broken toolchain: keep working, uncompiled
            self._fail(exc)
            return self.fn(*args)
        self.compiled_calls += 1
        return out

    def _fail(self, exc: Exception) -> None:
        self.enabled, self.failure = False, exc
        warnings.warn(f"{self.what}: {COMPILE_FAILED} ({exc}); using the eager kernel", stacklevel=3)

    def _ready(self, args: tuple[Any, ...]) -> Callable[..., Any] | None:
        """The compiled form if there is one now (loaded, or built here when not in the background)."""
        if self._thread is not None:  # the background job: finished?
            if self._thread.is_alive():
                return None
            if self._error is not None:
                raise self._error
            return self._built
        if self.loader is not None:
            loaded = self.loader(args)
            if loaded is not None:
                self.source = "loaded"
                return loaded
        if self.background:
            return None
        self.source = "compiled"
        return self._job(args)()

    def _job(self, args: tuple[Any, ...]) -> Callable[[], Callable[..., Any]]:
        """The job that makes the compiled form: ``build``'s, falling back to ``torch.compile`` where
        ``build`` gives no job or its job gives None (what it cannot make)."""
        default = self._torch_compile(args)
        custom = self.builder(args) if self.builder is not None else None
        if custom is None:
            return default

        def job() -> Callable[..., Any]:
            return custom() or default()

        return job

    def _torch_compile(self, args: tuple[Any, ...]) -> Callable[[], Callable[..., Any]]:
        """``torch.compile(fn)``; in the background compiled by one call on copies of ``args``, in
        this call's grad and inference modes (a compilation in other modes would be redone)."""
        import torch

        copies = _copies(args) if self.background else ()
        inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

        def job() -> Callable[..., Any]:
            if _toolchain.cxx:  # inductor's own setting (it reads $CXX when none is given)
                from torch._inductor import config as inductor

                inductor.cpp.cxx = (None, _toolchain.cxx)  # type: ignore[attr-defined]
            extra = dict(self.settings, **({"options": self.options} if self.options else {}))
            compiled = torch.compile(self.fn, dynamic=self.dynamic, **extra)
            if self.background:
                with torch.inference_mode(inference), torch.set_grad_enabled(grad), self.held_settings():
                    compiled(*copies)
            return compiled

        return job

    def _start(self, args: tuple[Any, ...]) -> None:
        job = self._job(args)
        self.source = "compiled"

        def run() -> None:
            try:
                self._built = job()
            except Exception as exc:  # reported by the next call, in the caller's thread
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"compile {self.what}", daemon=True)
        self._thread.start()

    def held_settings(self) -> contextlib.AbstractContextManager:
        """The settings held while the compiled function runs (and compiles, at its first call and
        whenever dynamo recompiles it). Each costs time on every call: only steps ask for them."""
        if not (self.patch or self.distinct_sizes):
            return contextlib.nullcontext()
        import torch._inductor.config
        import torch.fx.experimental._config

        stack = contextlib.ExitStack()
        if self.patch:
            # torch installs ``patch`` on its config modules at import (install_config_module)
            stack.enter_context(torch._inductor.config.patch(self.patch))  # type: ignore[attr-defined]
        if self.distinct_sizes:
            stack.enter_context(torch.fx.experimental._config.patch(use_duck_shape=False))  # type: ignore[attr-defined]
        return stack


def _copies(args: Any) -> Any:
    """``args`` with every tensor cloned (in lists and tuples too): what a background compile may write."""
    if isinstance(args, (list, tuple)):
        return type(args)(_copies(a) for a in args)
    return args.clone() if hasattr(args, "clone") and hasattr(args, "shape") else args


def load_package(package: Path) -> Any:
    """``torch._C._aoti.AOTIModelPackageLoader`` of an AOTInductor package (its model "model", on the CPU).

    The loader unpacks the package into a new ``aotinductor_*`` folder of the system's temporary
    directory and removes it only when the loader is destroyed, which a process's end does not do for
    an object still referenced (a ``gptlab`` command ends with its start's objects kept, unfinalised),
    nor a process killed (SIGTERM without a handler, SIGKILL): every such command left ~4 MB there.
    A CPU package's shared library is mapped into the process once the loader is made, and nothing
    else is read from that folder later, so the folders that appeared while this one was unpacked,
    holding its library, are removed at once. A package with CUDA kernels (``.cubin``, loaded from
    their files at first use) keeps its folder until the process exits.
    """
    import torch

    temp = Path(tempfile.gettempdir())
    before = set(temp.glob("aotinductor_*"))
    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
    with zipfile.ZipFile(package) as archive:
        names = archive.namelist()
    libraries = {Path(n).name for n in names if n.endswith(".so")}
    lazy = any(n.endswith(".cubin") for n in names)
    for folder in set(temp.glob("aotinductor_*")) - before:
        if any(f.name in libraries for f in folder.rglob("*.so")):  # this package's, not another's
            if lazy:
                atexit.register(shutil.rmtree, folder, True)
            else:
                shutil.rmtree(folder, ignore_errors=True)
    return loader
