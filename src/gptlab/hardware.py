"""What this machine runs fast: the device, the precision and the kernels, chosen from what it reports.

``plan(machine, device, dtype)`` is a pure function of a ``Machine`` — the CPU's flags,
``torch.backends.cpu.get_cpu_capability()``, CUDA's device count and bf16 support, MPS —
and ``detect()`` reads those reports once per process. The rules (docs/guide/hardware.md):

    device = auto     cuda:0 if CUDA works, else mps (Apple's GPU), else cpu
    dtype  = auto     cuda: bfloat16 autocast if the GPU supports it, else float16 with a GradScaler
                      cpu:  bfloat16 only where the CPU has native bf16 (avx512_bf16 or amx_bf16
                            flags, and torch dispatching AVX-512 kernels), else float32
                      mps:  float32
    attention = auto  plain on a CPU in bfloat16 (its bf16 matmuls beat the fused kernel's
                      bf16 backward there) or for contexts of at most PLAIN_CONTEXT tokens (the
                      T×T scores are small, and batched products beat the fused kernel's tiles),
                      else sdpa
    compile = auto    torch.compile the training forward on CUDA, and on a CPU under bf16/fp16
                      autocast, where it was measured to pay; a CPU in float32 (where the cold
                      compilation cost more than it saved) and MPS train eagerly
    Muon              Newton–Schulz in bfloat16 where bf16 is native (torch.optim.Muon), else float32;
                      float32 wherever dtype is float32
    inference         bf16 weights where bf16 is native, else fp32; bf16 weights are prepacked for
                      oneDNN only with native bf16, and otherwise multiply in float32
    one row           a decode step's one row times a matrix that streams from memory: the library
                      kernels (oneDNN's prepacked bf16, ``_weight_int8pack_mm``, MKL) where bf16 is
                      native; elsewhere the compiled one-row reduction, which converts bf16 and int8
                      weights to float in registers for the float32 activations (no compiler needed
                      at start-up where the library kernels serve)
    int8 blocks       a GGUF file's Q8_0 matrices: int8 per output channel where bf16 is native;
                      elsewhere each block's scale kept, as two int4 planes through the int4 kernel
    huge pages        a CPU decode's weights moved onto 2 MB transparent huge pages in a thread from
                      its first decode step (Linux ≥ 6.1, ``MADV_COLLAPSE``), wherever the kernel can

A bf16 matrix product on a CPU without native bf16 is emulated, and many times slower than in
float32 (docs/benchmarks.md#precision).
"""

from __future__ import annotations

import errno
import functools
import re
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})  # /proc/cpuinfo names
DEVICE_NAMES = "auto, cpu, cuda, cuda:N or mps"
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Machine:
    """What the machine reports; ``detect()`` fills it in, tests build one by hand."""

    cpu_capability: str = "DEFAULT"  # torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, ...
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    cuda_built: bool = False  # this torch was built with CUDA
    cuda_devices: int = 0  # torch.cuda.device_count() (0 when CUDA is not available)
    cuda_bf16: bool = False  # torch.cuda.is_bf16_supported()
    mps_built: bool = False
    mps_available: bool = False

    @property
    def native_bf16(self) -> bool:
        """The CPU multiplies bf16 natively, and torch's kernels for it are dispatched."""
        return bool(self.cpu_flags & NATIVE_BF16_FLAGS) and self.cpu_capability.upper().startswith("AVX512")

    def describe_cpu(self) -> str:
        """``"AVX2, no native bf16"`` / ``"AVX512, native bf16 (amx_bf16, avx512_bf16)"``."""
        if self.native_bf16:
            return f"{self.cpu_capability}, native bf16 ({', '.join(sorted(self.cpu_flags & NATIVE_BF16_FLAGS))})"
        return f"{self.cpu_capability}, no native bf16"


@dataclass(frozen=True)
class Plan:
    """What ``auto`` resolved to on one device (recorded in a run's ``train_config.json``)."""

    device: str  # cpu | cuda:N | mps
    dtype: str  # training and evaluation autocast: float32 | bfloat16 | float16
    attention: str  # plain | sdpa
    newton_schulz: str  # Muon's orthogonalisation: bfloat16 (torch.optim.Muon) | float32
    weights: str  # inference weights for --dtype auto: fp32 | bf16
    bf16_matmul: str  # how bf16 weights multiply many rows: packed (oneDNN) | plain | float32
    one_row: str  # how a CPU decode step's one row multiplies a streaming matrix: library | compiled
    compile: bool  # torch.compile the training forward (compile_training)
    machine: str  # what the choice was made from, for people

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"{self.device} ({self.machine}): dtype {self.dtype}, attention {self.attention}, "
            f"Muon Newton–Schulz in {self.newton_schulz}, {'compiled' if self.compile else 'eager'}"
        )


# ------------------------------------------------------------------ detection
def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.MULTILINE)
    return frozenset(match.group(1).split()) if match else frozenset()


@functools.lru_cache(maxsize=1)
def detect() -> Machine:
    """This machine's reports (read once per process)."""
    import torch

    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None)
    return Machine(
        cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        cpu_flags=_cpu_flags(),
        cuda_built=torch.backends.cuda.is_built(),
        cuda_devices=torch.cuda.device_count() if cuda else 0,
        cuda_bf16=bool(cuda and torch.cuda.is_bf16_supported()),
        mps_built=bool(mps and mps.is_built()),
        mps_available=bool(mps and mps.is_available()),
    )


# ------------------------------------------------------------------ devices
def resolve_device(name: str, machine: Machine | None = None, option: str = "device=") -> str:
    """``auto`` → ``cuda:0``, ``mps`` or ``cpu``; a named device is checked against the machine.

    ``option`` is how the user spells the setting (``device=`` for train, ``--device `` for the
    other commands), so the error says what to type. Returns ``cpu``, ``cuda:N`` or ``mps``.
    """
    m = machine or detect()
    name = str(name).strip().lower()
    fix = f"use {option}cpu or {option}auto"
    if name == "auto":
        return "cuda:0" if m.cuda_devices else "mps" if m.mps_available else "cpu"
    if name == "cpu":
        return "cpu"
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match:
        if not m.cuda_built:
            raise GptlabError(f"device {name!r} is not available here (this torch has no CUDA); {fix}")
        if not m.cuda_devices:
            raise GptlabError(f"device {name!r} is not available here (no CUDA GPU is visible); {fix}")
        index = int(match.group(1) or 0)
        if index >= m.cuda_devices:
            gpus = (
                "1 GPU, cuda:0"
                if m.cuda_devices == 1
                else f"{m.cuda_devices} GPUs, cuda:0 to cuda:{m.cuda_devices - 1}"
            )
            raise GptlabError(
                f"device {name!r} is not available here (this machine has {gpus}); "
                f"use {option}cuda:0 or {option}auto"
            )
        return f"cuda:{index}"
    if name == "mps":
        if not m.mps_available:
            why = (
                "this torch's MPS backend finds no Apple GPU"
                if m.mps_built
                else "MPS needs an Apple-silicon Mac"
            )
            raise GptlabError(f"device 'mps' is not available here ({why}); {fix}")
        return "mps"
    raise GptlabError(f"unknown device {name!r}; choose one of {DEVICE_NAMES} (an NVIDIA GPU is cuda)")


def check_ranks(device: str, local_world_size: int, machine: Machine | None = None) -> None:
    """More processes on this node than GPUs is one line, not a crash in the first CUDA call."""
    m = machine or detect()
    if device.startswith("cuda") and local_world_size > m.cuda_devices:
        gpus = f"{m.cuda_devices} GPU{'s' if m.cuda_devices != 1 else ''}"
        raise GptlabError(
            f"{local_world_size} processes but {gpus}; use --nproc_per_node={max(m.cuda_devices, 1)} "
            f"or device=cpu"
        )


# ------------------------------------------------------------------ precision and kernels
def native_bf16(device: str, machine: Machine | None = None) -> bool:
    """bf16 arithmetic runs at full speed on ``device`` (a resolved device string)."""
    m = machine or detect()
    kind = device.split(":")[0]
    return {"cuda": m.cuda_bf16, "cpu": m.native_bf16}.get(kind, False)


def training_dtype(device: str, requested: str = "auto", machine: Machine | None = None) -> str:
    """The autocast dtype: an explicit one as given, ``auto`` by the rules in the module docstring."""
    if requested != "auto":
        return requested
    m = machine or detect()
    kind = device.split(":")[0]
    if kind == "cuda":
        return "bfloat16" if m.cuda_bf16 else "float16"
    return "bfloat16" if kind == "cpu" and m.native_bf16 else "float32"


def inference_weights(device: str, sequences: int = 1, machine: Machine | None = None) -> str:
    """``--dtype auto`` for inference weights (``sample``, ``chat``, ``serve``): ``bf16`` or ``fp32``.

    bf16 where bf16 is native (activations bf16 too). On a CPU that only emulates bf16, bf16
    matrices with float32 activations (``gptlab.quantize``) for **one** sequence: its decode step
    streams every weight once, and half the bytes decode faster; fp32 for several, whose products of
    many rows convert each bf16 matrix to float32 first, which costs more than it saves
    (docs/benchmarks.md#decoding).
    Elsewhere (MPS, GPUs without bf16): fp32.
    """
    m = machine or detect()
    if native_bf16(device, m):
        return "bf16"
    return "bf16" if device.split(":")[0] == "cpu" and sequences == 1 else "fp32"


PLAIN_CONTEXT = 64  # on a CPU, contexts up to this many tokens attend through the plain path


def attention_path(device: str, dtype: str, requested: str = "auto", context: int | None = None) -> str:
    """``plain`` on a CPU for bf16 (its bf16 matmuls beat the fused kernel's bf16 backward) or for a
    context of at most ``PLAIN_CONTEXT`` tokens (whose ``T×T`` scores are small); else ``sdpa``.

    On an AVX2 CPU in float32 the plain path's step was the shorter at T = 64 and level at T = 128
    (docs/benchmarks.md#training); longer contexts are where the fused kernel saves the
    ``B·H·T²`` scores' memory.
    """
    if requested != "auto":
        return requested
    if device != "cpu":
        return "sdpa"
    small = context is not None and context <= PLAIN_CONTEXT
    return "plain" if dtype == "bfloat16" or small else "sdpa"


def compile_training(device: str, dtype: str, requested: bool | str = "auto") -> bool:
    """Whether a training forward is ``torch.compile``'d: ``requested``, or for ``auto``, on CUDA
    always, and on a CPU only under bf16/fp16 autocast; MPS trains eagerly.

    Measured with the ``reference`` recipe (docs/benchmarks.md#training): under bf16 autocast on a
    CPU with native bf16 the compiled step is clearly shorter; in float32 on an AVX2 CPU compiling
    saves a little of each step, and a cold compilation takes that back within the recipe's run.
    On a GPU, fusion saves kernel launches and memory traffic at any precision.
    """
    if requested != "auto":
        return bool(requested)
    kind = device.split(":")[0]
    return kind == "cuda" or (kind == "cpu" and dtype in ("bfloat16", "float16"))


def plan(
    machine: Machine | None = None,
    device: str = "auto",
    dtype: str = "auto",
    attention: str = "auto",
    context: int | None = None,
    compile: bool | str = "auto",
) -> Plan:
    """Every choice for one device, from the machine's reports alone (and the model's ``context``)."""
    m = machine or detect()
    dev = resolve_device(device, m)
    chosen = training_dtype(dev, dtype, m)
    native = native_bf16(dev, m)
    what = m.describe_cpu() if dev == "cpu" else f"CUDA, bf16 {'supported' if m.cuda_bf16 else 'unsupported'}"
    return Plan(
        device=dev,
        dtype=chosen,
        attention=attention_path(dev, chosen, attention, context),
        newton_schulz="bfloat16" if native and chosen != "float32" else "float32",
        weights="bf16" if native else "fp32",
        bf16_matmul=("packed" if native else "float32") if dev == "cpu" else "plain",
        one_row=one_row_kernel(dev, m),
        compile=compile_training(dev, chosen, compile),
        machine=what if dev != "mps" else "Apple MPS",
    )


def one_row_kernel(device: str, machine: Machine | None = None) -> str:
    """How a decode step multiplies its one row by a matrix too large for the caches, on a CPU.

    ``library`` where bf16 is native: activations are bf16 there, and the library's one-row kernels
    (oneDNN's prepacked bf16, ``_weight_int8pack_mm`` with bf16 rows, MKL's fp32 ``sgemv``) read the
    weights faster than the compiled reduction, at SmolLM2's shapes 1.2–5× per matrix and 1.1–1.3×
    per decoded token (docs/benchmarks.md, "The one-row product"), with no compiler to import at start-up.
    ``compiled`` elsewhere: activations are float32 there, which the int8 kernel is slow with and
    bf16 weights would have to be converted to whole; the compiled reduction converts each weight
    in registers instead (``gptlab.model.quantized.gemv``). Other devices: ``library``.
    """
    m = machine or detect()
    if device.split(":")[0] != "cpu":
        return "library"
    return "library" if native_bf16(device, m) else "compiled"


def int8_blocks(device: str, machine: Machine | None = None) -> str:
    """How a CPU holds a matrix of int8 blocks (a GGUF file's Q8_0: an fp16 scale a block of 32 weights).

    ``int8`` where bf16 is native: one scale per output channel, multiplied by torch's int8 kernel,
    whose bf16 rows are 1.6–3.5× faster than the planes at SmolLM2's shapes, in 20 % fewer bytes.
    ``planes`` elsewhere: each block's own scale kept, as two int4 planes through the int4 kernel
    (``gptlab.model.int4.q8_planes``), which multiplies one float32 row by them 1.5–3× faster than the
    int8 kernel and 3.4–5.9× faster than the compiled one-row reduction an int8 matrix takes there, and
    needs no compiler at load (``python bench/one_row.py``; docs/benchmarks.md, "Q8_0 matrices as two
    int4 planes below native bf16").
    """
    return "int8" if one_row_kernel(device, machine) == "library" else "planes"


# ------------------------------------------------------------------ emulated bf16
@functools.lru_cache(maxsize=1)
def bf16_slowdown() -> float:
    """How many times slower a bf16 matrix product is than a float32 one on this CPU (measured once)."""
    import torch

    a, b = torch.randn(1024, 128), torch.randn(128, 512)  # a training-sized product

    def best(x: torch.Tensor, y: torch.Tensor) -> float:
        x @ y
        times = []
        for _ in range(2):
            t = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - t)
        return min(times)

    return best(a.bfloat16(), b.bfloat16()) / max(best(a, b), 1e-9)


def emulated_bf16_warning(
    device: str,
    setting: str,
    instead: str = "dtype=auto",
    machine: Machine | None = None,
    slowdown: float | None = None,
) -> str | None:
    """One line when bf16 was asked for explicitly on a CPU that only emulates it; else None.

    ``setting`` is what the user wrote (``dtype=bfloat16``, ``--dtype bf16``), ``instead`` what
    to write for speed.
    """
    m = machine or detect()
    if device != "cpu" or m.native_bf16:
        return None
    ratio = bf16_slowdown() if slowdown is None else slowdown
    return (
        f"warning: {setting} on this CPU ({m.describe_cpu()}) is emulated: its matrix products run "
        f"about {ratio:.0f}× slower than float32 here; {instead} picks float32"
    )


def warn_if_emulated(device: str, dtype: str, setting: str, instead: str = "dtype=auto") -> None:
    """Print ``emulated_bf16_warning`` (one line on stderr) when ``dtype`` is bf16 on such a CPU."""
    if dtype in ("bfloat16", "bf16"):
        line = emulated_bf16_warning(device, setting, instead)
        if line:
            sys.stderr.write(line + "\n")


#: ``omp_pause_hard`` (OpenMP 5.0): release what the runtime holds, its worker threads included
_OMP_PAUSE_HARD = 2


def hand_threads_over() -> bool:
    """Release the calling thread's OpenMP workers (``omp_pause_resource_all(omp_pause_hard)``) before
    another thread takes over the parallel work → whether the runtime did.

    Each thread that starts parallel work (a load, a matrix product) becomes the master of an OpenMP
    team whose workers live as long as it does. GNU OpenMP, the one torch ships on Linux, lets its
    idle workers spin between parallel regions only while the process holds no more OpenMP threads
    than CPUs; beyond that every region wakes its workers through the kernel. A decode step runs
    ~450 regions a token, so a server whose main thread loaded the model (its team idle, yet alive)
    decoded on its scheduler thread 3.3× slower than the same step on the loading thread (SmolLM2's
    kept int4 step, 2 CPUs: 37 against 123 tokens/s). Parallel work on the calling thread afterwards makes a new team;
    a runtime without the call (or whose call fails) changes nothing."""
    import ctypes

    try:
        pause = ctypes.CDLL(None).omp_pause_resource_all
    except (AttributeError, OSError):
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return bool(pause(_OMP_PAUSE_HARD) == 0)


#: glibc ``mallopt`` parameters (malloc.h)
_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3
#: blocks from this size come from ``mmap`` (and go back to the system when freed): glibc's own ceiling
#: for its adaptive threshold, so only blocks past a prefill's activations do
HEAP_MMAP_THRESHOLD = 32 << 20
#: what the heap keeps at its top when it shrinks, rather than handing it back at each free
HEAP_TOP_PAD = 64 << 20


@functools.cache
def _glibc() -> Any:
    """The C library when it is glibc (``malloc_trim`` and ``mallopt`` are glibc's), else None; found
    once per process (``find_library`` runs ``ldconfig``: 1–4 ms, and decoding asks at every request)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "malloc_trim"):
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    libc.madvise.argtypes, libc.madvise.restype = (
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int],
        ctypes.c_int,
    )
    return libc


def release_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim(0)``) → whether the
    library could. glibc keeps freed small and medium blocks in its heap: after float32 weights are
    replaced by int8 ones, or after a long prompt's pass, the process still holds that memory."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    return libc is not None


def map_large_blocks(threshold: int = 2**20) -> bool:
    """Blocks of ``threshold`` bytes or more get their own mapping, returned to the system when freed
    (while weights are loaded; ``keep_heap`` sets the decoding threshold again).

    By default glibc raises this threshold to the largest block freed so far (up to 32 MB), so the
    float weights converted one after another while loading land in the heap between the int8 ones
    that stay, and the heap grows to several times the model (SmolLM2 int8: 1.0 GB instead of 0.5 GB
    while loading). A fixed threshold also stops that adjustment for the rest of the process.
    """
    libc = _glibc()
    return libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, threshold) == 1


def keep_heap() -> bool:
    """Let the C heap keep ``HEAP_TOP_PAD`` bytes at its top and serve blocks below
    ``HEAP_MMAP_THRESHOLD`` (glibc's ``mallopt``) → whether the allocator took both. Decoding sets it
    when a model's engine is made and again at each request, since loading another model in the
    same process maps large blocks again (``map_large_blocks``); each call costs microseconds.

    An eager forward pass allocates and frees a block of 1–4 MB per operation (a 505-token prefill's
    activations, an int4 matrix dequantised for it). glibc's allocator starts with blocks from 128 KB
    mapped afresh and returns the heap's top above twice its threshold, both adapted as the process
    runs, so the same pass sometimes paid 50,000–120,000 page faults (each new page zeroed by the
    kernel) and sometimes none, by the order of earlier frees: SmolLM2's int4 prefill took 0.40–0.43 s
    in such a process against 0.30–0.34 (docs/benchmarks.md#beside-llamacpp). With both set, the
    blocks are reused. Resident memory is what the unlucky process's would have been plus at most the
    pad's touched pages (measured: none to +25 MB with SmolLM2's int4 file, +60 MB with its int8 one
    under AVX2, whose float32 prefill converts each matrix), until decoding hands it back after a long
    pass and at each request (``gptlab.generate.session.release_after_pass``). An allocator without
    ``mallopt`` (musl, macOS) changes nothing."""
    libc = _glibc()
    return (
        libc is not None
        and libc.mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD) == 1
        and libc.mallopt(_M_TOP_PAD, HEAP_TOP_PAD) == 1
    )


#: the size of a transparent huge page on x86-64 and most arm64 kernels, and of a base page
HUGE_PAGE, _SMALL_PAGE = 2 << 20, 4096
#: ``madvise`` advice (linux/mman.h): may use huge pages; collapse into huge pages now (Linux ≥ 6.1)
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25


def storage_ranges(tensors: Iterable[Any]) -> set[tuple[int, int]]:
    """The ``[start, end)`` address range of each CPU tensor's storage (a storage shared by several once).
    A tensor with no plain storage (oneDNN's packed copy of a bf16 matrix, an opaque ``_mkldnn`` tensor;
    a sparse one) has no range it exposes, and is left out."""
    import torch  # (tensors exist: torch is imported already)

    return {
        (s.data_ptr(), s.data_ptr() + s.nbytes())
        for t in tensors
        if t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_meta
        and (s := t.untyped_storage()).data_ptr()
    }


def huge_page_spans(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of whole ``HUGE_PAGE``s inside the address ``ranges``: the ranges
    merged where less than a 4 KB page lies between them (an allocator's headers and alignment), each
    cut in to huge-page boundaries. So every 4 KB page of a span holds some of the ranges' bytes: for
    tensors' storages, pages that are resident already, and backing a span with huge pages makes
    nothing resident that was not (a free block, another object)."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start - merged[-1][1] < _SMALL_PAGE:  # no whole page between the two
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    spans = []
    for start, end in merged:
        first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        if last > first:
            spans.append((first, last))
    return spans


def back_with_huge_pages(tensors: Iterable[Any]) -> int:
    """Move the CPU tensors' memory onto transparent huge pages (``madvise`` ``MADV_HUGEPAGE``, then
    ``MADV_COLLAPSE``, one huge page at a time) → the bytes now on huge pages.

    A decode step streams every weight once per token, and weights beyond the caches stream from
    memory: on 4 KB pages that is a TLB miss every 4 KB, and the hardware prefetchers stop at each
    page's end. On 2 MB pages SmolLM2's float32 step decoded 1.11–1.24× faster (docs/benchmarks.md). The
    contents are unchanged (the kernel copies them); the cost is that copy and finding free huge
    pages, ~2.4 ms a huge page on a 2-vCPU VM, so decoding runs it in a thread
    (``back_with_huge_pages_later``). A kernel without transparent huge pages or ``MADV_COLLAPSE``
    (Linux < 6.1, another system) changes nothing and returns 0."""
    libc = _glibc()
    if libc is None or not sys.platform.startswith("linux"):
        return 0
    import ctypes

    backed = 0
    for start, end in huge_page_spans(storage_ranges(tensors)):
        if libc.madvise(start, end - start, _MADV_HUGEPAGE) != 0:
            return backed
        for page in range(start, end, HUGE_PAGE):
            if libc.madvise(page, HUGE_PAGE, _MADV_COLLAPSE) != 0:
                if ctypes.get_errno() == errno.EINVAL:  # no MADV_COLLAPSE in this kernel
                    return backed
                continue  # this one page could not be collapsed now (no free huge page)
            backed += HUGE_PAGE
    return backed


class HugePageThread(threading.Thread):
    """``back_with_huge_pages(tensors)`` in a daemon thread (the ``madvise`` calls release the GIL):
    ``backed`` is its result once it has run to the end (None before, and if it raised)."""

    def __init__(self, tensors: Iterable[Any]) -> None:
        super().__init__(name="gptlab-huge-pages", daemon=True)
        self._held: list[Any] | None = list(tensors)  # held until done
        self.backed: int | None = None

    def run(self) -> None:
        held, self._held = self._held, None
        self.backed = back_with_huge_pages(held or [])


def back_with_huge_pages_later(tensors: Iterable[Any]) -> HugePageThread:
    """``back_with_huge_pages`` in a ``HugePageThread``, started now → the thread."""
    thread = HugePageThread(tensors)
    thread.start()
    return thread
