"""gptlab.hardware: device, precision and kernels chosen from what a machine reports (fake machines here)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptlab import hardware
from gptlab.errors import GptlabError
from gptlab.hardware import Machine, plan, resolve_device
from tests._machines import (
    APPLE,
    AVX2,
    AVX512_BF16,
    AVX512_BF16_AS_AVX2,
    AVX512_NO_BF16,
    CUDA_BF16,
    CUDA_NO_BF16,
    CUDA_TORCH_NO_GPU,
)
from tests._tiny import tiny_model

# machine -> (device, dtype, attention, Newton–Schulz, inference weights, bf16 matmul of many rows,
#             a decode step's one-row product, compile)
EXPECTED = {
    "avx2": (AVX2, ("cpu", "float32", "sdpa", "float32", "fp32", "float32", "compiled", False)),
    "avx512_bf16": (AVX512_BF16, ("cpu", "bfloat16", "plain", "bfloat16", "bf16", "packed", "library", True)),
    "avx512_without_bf16": (
        AVX512_NO_BF16,
        ("cpu", "float32", "sdpa", "float32", "fp32", "float32", "compiled", False),
    ),
    "avx512_bf16_dispatching_avx2": (
        AVX512_BF16_AS_AVX2,
        ("cpu", "float32", "sdpa", "float32", "fp32", "float32", "compiled", False),
    ),
    "cuda_bf16": (CUDA_BF16, ("cuda:0", "bfloat16", "sdpa", "bfloat16", "bf16", "plain", "library", True)),
    "cuda_without_bf16": (
        CUDA_NO_BF16,
        ("cuda:0", "float16", "sdpa", "float32", "fp32", "plain", "library", True),
    ),
    "apple_mps": (APPLE, ("mps", "float32", "sdpa", "float32", "fp32", "plain", "library", False)),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_auto_chooses_the_documented_device_precision_and_kernels(name):
    machine, expected = EXPECTED[name]
    p = plan(machine)
    chosen = (p.device, p.dtype, p.attention, p.newton_schulz, p.weights, p.bf16_matmul, p.one_row, p.compile)
    assert chosen == expected
    assert p.to_dict()["dtype"] == p.dtype and p.device in p.summary()
    assert p.summary().endswith(", compiled" if p.compile else ", eager")


def test_the_cpu_of_a_gpu_machine_follows_the_cpu_rules():
    on_cpu = plan(CUDA_BF16, device="cpu")  # a GPU with bf16, a CPU without: the CPU's rules
    assert (on_cpu.device, on_cpu.dtype, on_cpu.newton_schulz) == ("cpu", "float32", "float32")
    assert plan(AVX512_BF16, device="cpu").dtype == "bfloat16"


def test_explicit_settings_are_honoured():
    p = plan(AVX2, dtype="bfloat16", attention="sdpa")
    assert (p.dtype, p.attention) == ("bfloat16", "sdpa")
    assert plan(AVX2, dtype="bfloat16").attention == "plain"  # bf16 on a CPU: the plain path
    assert plan(AVX512_BF16, dtype="float32").attention == "sdpa"


def test_compile_auto_follows_the_device_and_the_precision():
    # a CPU compiles only under autocast: in float32 the cold compilation cost more than it saved
    assert plan(AVX2, dtype="bfloat16").compile is True
    assert plan(AVX512_BF16, dtype="float32").compile is False
    assert plan(CUDA_BF16, dtype="float32").compile is True  # a GPU at any precision
    assert plan(CUDA_BF16, device="cpu").compile is False  # that machine's CPU follows the CPU rule
    # asked for: honoured either way
    assert plan(AVX2, compile=True).compile is True and plan(CUDA_BF16, compile=False).compile is False


def test_short_contexts_attend_through_the_plain_path_on_a_cpu_only():
    assert plan(AVX2, context=64).attention == "plain"  # T×T scores small: batched products
    assert plan(AVX2, context=65).attention == "sdpa"  # longer: the fused kernel, no B·H·T² scores
    assert plan(AVX2).attention == "sdpa"  # context unknown
    assert plan(AVX512_BF16, context=1024).attention == "plain"  # bf16 on a CPU, any context
    assert plan(CUDA_BF16, context=64).attention == plan(APPLE, context=64).attention == "sdpa"
    assert plan(AVX2, attention="sdpa", context=64).attention == "sdpa"  # asked for: honoured


def test_native_bf16_needs_the_flag_and_avx512_dispatch():
    assert AVX512_BF16.native_bf16 and not AVX2.native_bf16 and not AVX512_NO_BF16.native_bf16
    assert not AVX512_BF16_AS_AVX2.native_bf16
    amx = Machine(cpu_capability="AVX512", cpu_flags=frozenset({"amx_bf16", "amx_tile"}))
    assert amx.native_bf16 and "amx_bf16" in amx.describe_cpu()
    assert AVX2.describe_cpu() == "AVX2, no native bf16"


def test_int8_blocks_are_kept_as_planes_only_below_native_bf16():
    """A GGUF file's Q8_0 matrices: int8 per channel where the library's int8 kernel takes bf16 rows, two
    int4 planes of the blocks where a float32 row would go through the compiled reduction."""
    from gptlab.hardware import int8_blocks, one_row_kernel

    for m in (AVX2, AVX512_NO_BF16, AVX512_BF16_AS_AVX2):
        assert one_row_kernel("cpu", m) == "compiled" and int8_blocks("cpu", m) == "planes"
    assert int8_blocks("cpu", AVX512_BF16) == "int8" and int8_blocks("cuda:0", AVX2) == "int8"


@pytest.mark.parametrize(
    ("machine", "name", "option", "message"),
    [
        (
            AVX2,
            "cuda",
            "device=",
            "device 'cuda' is not available here (this torch has no CUDA); use device=cpu or device=auto",
        ),
        (AVX2, "cuda:0", "--device ", "this torch has no CUDA); use --device cpu or --device auto"),
        (CUDA_TORCH_NO_GPU, "cuda", "device=", "no CUDA GPU is visible"),
        (
            CUDA_BF16,
            "cuda:7",
            "device=",
            "device 'cuda:7' is not available here (this machine has 1 GPU, cuda:0)",
        ),
        (CUDA_NO_BF16, "cuda:2", "device=", "2 GPUs, cuda:0 to cuda:1"),
        (AVX2, "gpu", "device=", "unknown device 'gpu'; choose one of auto, cpu, cuda, cuda:N or mps"),
        (AVX2, "cuda:x", "device=", "unknown device 'cuda:x'"),
        (AVX2, "mps", "device=", "device 'mps' is not available here (MPS needs an Apple-silicon Mac)"),
    ],
)
def test_a_device_the_machine_lacks_is_one_message(machine, name, option, message):
    with pytest.raises(GptlabError) as err:
        resolve_device(name, machine, option)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_devices_the_machine_has_resolve():
    assert resolve_device("auto", AVX2) == "cpu"
    assert resolve_device("auto", CUDA_BF16) == "cuda:0"
    assert resolve_device("auto", APPLE) == "mps"
    assert resolve_device("CUDA:1", CUDA_NO_BF16) == "cuda:1"
    assert resolve_device("cuda", CUDA_BF16) == "cuda:0"
    assert resolve_device("cpu", CUDA_BF16) == "cpu"


def test_more_processes_than_gpus_is_one_line():
    with pytest.raises(GptlabError, match=r"^2 processes but 1 GPU; use --nproc_per_node=1 or device=cpu$"):
        hardware.check_ranks("cuda:0", 2, CUDA_BF16)
    hardware.check_ranks("cuda:0", 2, CUDA_NO_BF16)  # two GPUs: fine
    hardware.check_ranks("cpu", 8, CUDA_BF16)  # gloo on the CPU: any number


def test_explicit_bf16_on_an_emulating_cpu_warns_in_one_line():
    line = hardware.emulated_bf16_warning("cpu", "dtype=bfloat16", machine=AVX2, slowdown=14.2)
    assert line is not None and "\n" not in line
    assert "emulated" in line and "about 14× slower" in line and "AVX2, no native bf16" in line
    assert hardware.emulated_bf16_warning("cpu", "dtype=bfloat16", machine=AVX512_BF16, slowdown=1) is None
    assert hardware.emulated_bf16_warning("cuda:0", "dtype=bfloat16", machine=CUDA_BF16, slowdown=1) is None


def test_detect_reads_this_machine():
    m = hardware.detect()
    assert m.cpu_capability == torch.backends.cpu.get_cpu_capability()
    assert m.cuda_devices == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if m.cpu_capability in ("AVX2", "AVX512") and m.cpu_flags:  # Linux x86: the flags were parsed
        assert "avx2" in m.cpu_flags
    assert plan().device == resolve_device("auto")


# ------------------------------------------------------------------ inference kernels per machine
def test_bf16_weights_multiply_many_rows_in_float32_where_bf16_is_emulated(monkeypatch):
    from gptlab.model import quantized as qz

    monkeypatch.setattr(hardware, "detect", lambda: AVX2)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96)
    layer = qz.PackedBF16Linear(linear)
    assert layer.matmul == "float32" and layer.packed is None
    calls = []
    real_linear = qz.F.linear
    monkeypatch.setattr(qz.F, "linear", lambda x, w, *a: calls.append(x.dtype) or real_linear(x, w, *a))
    with torch.inference_mode():
        many = layer(torch.randn(qz.UPCAST_MIN_ROWS, 64).bfloat16())  # float32 product
        few = layer(torch.randn(2, 64).bfloat16())  # bound by reading W: stays bf16
    assert calls == [torch.float32, torch.bfloat16]
    assert many.dtype == few.dtype == torch.bfloat16
    x = torch.randn(qz.UPCAST_MIN_ROWS, 64)
    with torch.inference_mode():
        assert (layer(x.bfloat16()).float() - linear(x)).abs().max() < 5e-2


def test_bf16_weights_are_prepacked_only_where_bf16_is_native(monkeypatch):
    from gptlab.model import quantized as qz

    monkeypatch.setattr(hardware, "detect", lambda: AVX512_BF16)
    layer = qz.PackedBF16Linear(torch.nn.Linear(32, 48))
    assert layer.matmul == ("packed" if qz.onednn_bf16() else "plain")
    assert (layer.packed is not None) == (layer.matmul == "packed")


@pytest.mark.parametrize(("machine", "act"), [(AVX2, torch.float32), (AVX512_BF16, torch.bfloat16)])
def test_int8_activations_follow_the_machine(machine, act, monkeypatch):
    import gptlab
    from gptlab.model import quantized as qz

    monkeypatch.setattr(hardware, "detect", lambda: machine)
    model = gptlab.quantize(tiny_model(vocab_size=40, block_size=8, n_layer=1, n_head=2), "int8")
    assert {p.dtype for p in model.parameters()} == {act}
    assert all(m.scales.dtype == act for m in model.modules() if isinstance(m, qz.Int8Linear))
    with torch.inference_mode():
        assert model(torch.randint(0, 40, (1, 8)))[0].dtype == act


@pytest.mark.parametrize(
    ("machine", "device", "sequences", "expected"),
    [
        (AVX512_BF16, "cpu", 1, "bf16"),  # native: bf16 weights and activations, any batch
        (AVX512_BF16, "cpu", 8, "bf16"),
        (AVX2, "cpu", 1, "bf16"),  # emulated: bf16 matrices, float32 activations, for one sequence ...
        (AVX2, "cpu", 8, "fp32"),  # ... fp32 for several (each product would convert W first)
        (AVX512_BF16_AS_AVX2, "cpu", 2, "fp32"),
        (CUDA_BF16, "cuda:0", 64, "bf16"),
        (CUDA_NO_BF16, "cuda:0", 1, "fp32"),
        (APPLE, "mps", 1, "fp32"),
    ],
)
def test_auto_inference_weights_follow_the_machine_and_the_number_of_sequences(
    machine, device, sequences, expected
):
    assert hardware.inference_weights(device, sequences, machine) == expected


def _threads() -> set[str]:
    """The process's threads (ids) now."""
    return set(os.listdir("/proc/self/task"))


def _parallel_work() -> None:
    x = torch.randn(1024, 1024)
    for _ in range(4):  # a product big enough to run on every intra-op thread
        x = torch.tanh(x @ x)


@pytest.fixture
def two_threads():
    """Two intra-op threads (the suite runs on one), then back."""
    was = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(was)


needs_threads = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="counts the process's threads in /proc/self/task (Linux)"
)


@needs_threads
def test_handing_threads_over_lets_the_calling_threads_workers_go(two_threads):
    """The thread that ran parallel work holds its OpenMP workers; handing its threads over ends them
    (on two intra-op threads, its one worker), and parallel work on it later
    still runs, with a team of its own again."""
    out: dict[str, object] = {}

    def on_a_thread_of_its_own():  # (the test's main thread may hold a team that others wait on)
        before = _threads()
        _parallel_work()
        out["with_team"] = len(_threads() - before)
        out["released"] = hardware.hand_threads_over()
        out["after"] = len(_threads() - before)
        _parallel_work()
        out["again"] = len(_threads() - before)

    t = threading.Thread(target=on_a_thread_of_its_own)
    t.start()
    t.join()
    assert out == {"with_team": 1, "released": True, "after": 0, "again": 1}


@needs_threads
def test_the_thread_that_builds_a_server_leaves_the_parallel_work_to_its_scheduler(tiny_model, two_threads):
    """A server built on a thread that loaded a model (its OpenMP team alive) leaves that thread no
    workers: only the scheduler's thread is added, whose team then does every decode step."""
    from gptlab.serve.scheduler import Scheduler
    from gptlab.tokenizers import CharTokenizer

    out: dict[str, int] = {}

    def build():
        before = _threads()
        tok = CharTokenizer.from_text("abcdef")
        model = tiny_model(vocab_size=tok.vocab_size)
        _parallel_work()  # (loading a real model does as much)
        scheduler = Scheduler(model, tok, max_batch=2)
        out["added"] = len(_threads() - before)  # threads started since, alive
        scheduler.close()

    t = threading.Thread(target=build)
    t.start()
    t.join()
    assert out == {"added": 1}  # the scheduler's thread, and no idle team beside it


_FAULTS_OF_A_PASS = """
import ctypes, resource, sys
from gptlab import hardware
kept = hardware.keep_heap() if sys.argv[1] == "keep" else None
if sys.argv[1] == "decoding":  # a model readied for decoding on the CPU
    from gptlab.generate import prepare_decoding
    from tests._tiny import tiny_model
    prepare_decoding(tiny_model())
if sys.argv[1] == "reloaded":  # readied, then another model loaded (large blocks mapped), then a request
    import torch
    from gptlab.generate import generate_ids, prepare_decoding
    from tests._tiny import tiny_model
    model = tiny_model()
    prepare_decoding(model)
    hardware.map_large_blocks()
    generate_ids(model, torch.tensor([[1, 2, 3]]), 1)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
MB = 1 << 20
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def a_pass():  # three 3 MB blocks held at once, written, freed: an eager pass's activations
    blocks = [libc.malloc(3 * MB) for _ in range(3)]
    for b in blocks:
        libc.memset(b, 1, 3 * MB)
    for b in blocks:
        libc.free(b)
per_pass = []
for _ in range(6):
    before = faults()
    a_pass()
    per_pass.append(faults() - before)
print(kept, *per_pass)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's allocator and its mallopt (Linux)",
)
def test_keeping_the_heap_lets_repeated_passes_reuse_their_blocks():
    """In a fresh process glibc maps each 3 MB block afresh and unmaps it when freed, so every pass
    faults its 9 MB of pages in again (~2,300); after ``keep_heap`` only the first pass does, and a
    model readied for decoding on the CPU has called it, as a request does again after another model's
    load mapped large blocks."""

    def run(mode: str) -> list[str]:
        cmd = [sys.executable, "-c", _FAULTS_OF_A_PASS, mode]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
        return done.stdout.split()

    kept, *faults = run("keep")
    assert kept == "True"
    assert int(faults[0]) > 2000 and all(int(f) < 100 for f in faults[1:])
    assert all(int(f) > 2000 for f in run("default")[1:])  # what the allocator does without it
    assert all(int(f) < 100 for f in run("decoding")[2:])
    assert all(int(f) < 100 for f in run("reloaded")[2:])  # a request sets it again after a load


# ------------------------------------------------------------ huge pages for the weights
_PAGE = 4096


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 24 * hardware.HUGE_PAGE), st.integers(1, 6 * hardware.HUGE_PAGE)),
        min_size=1,
        max_size=6,
    )
)
def test_huge_page_spans_hold_only_pages_the_ranges_touch(raw: list[tuple[int, int]]) -> None:
    """Every span is whole huge pages; every 4 KB page of a span holds bytes of some range (so backing
    it makes nothing resident that was not); every huge page inside one range is in a span."""
    ranges = [(start, start + length) for start, length in raw]
    spans = hardware.huge_page_spans(ranges)
    big = hardware.HUGE_PAGE
    assert all(s % big == 0 and e % big == 0 and s < e for s, e in spans)
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False))
    for s, e in spans:
        for page in range(s, e, _PAGE):
            assert any(a < page + _PAGE and page < b for a, b in ranges), hex(page)
    for a, b in ranges:
        for page in range(-(-a // big) * big, b // big * big, big):
            assert any(s <= page and page + big <= e for s, e in spans), hex(page)


def _collapse_expected() -> str | None:
    """Why this machine cannot back memory with huge pages on demand (None: it can: Linux ≥ 6.1 has
    ``MADV_COLLAPSE``, and transparent huge pages are not switched off)."""
    if not sys.platform.startswith("linux"):
        return "transparent huge pages are a Linux feature"
    major, minor = (int(x) for x in re.findall(r"\d+", platform.release())[:2])
    if (major, minor) < (6, 1):
        return f"MADV_COLLAPSE needs Linux ≥ 6.1 (this kernel: {platform.release()})"
    enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not enabled.exists() or "[never]" in enabled.read_text():
        return "transparent huge pages are switched off on this machine"
    return None


def _huge_kb_at(address: int) -> int:
    """The kernel's ``AnonHugePages`` for the mapping of this process that holds ``address`` (kB)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_weights_backed_with_huge_pages_keep_their_values() -> None:
    """``back_with_huge_pages`` moves a tensor's whole huge pages onto huge pages, as the kernel
    reports them, and every value stays; where the kernel cannot, it changes nothing."""
    t = torch.randn(3 * hardware.HUGE_PAGE // 4)  # 6 MB: at least two whole huge pages inside
    before = t.clone()
    spans = hardware.huge_page_spans(hardware.storage_ranges([t, t[10:]]))  # a view: the same storage
    assert len(spans) == 1 and spans[0][1] - spans[0][0] >= 2 * hardware.HUGE_PAGE
    backed = hardware.back_with_huge_pages([t])
    assert torch.equal(t, before)
    reason = _collapse_expected()
    if reason is not None:
        assert backed == 0
        pytest.skip(reason)
    assert backed == spans[0][1] - spans[0][0]
    assert _huge_kb_at(spans[0][0]) * 1024 >= backed


def test_tensors_without_a_plain_storage_have_no_range() -> None:
    """oneDNN's packed copy of a bf16 matrix (an opaque tensor) and a sparse tensor expose no storage:
    they are left out of the ranges, beside a plain tensor's."""
    t = torch.randn(64, 64)
    opaque = [t.to_mkldnn(), t.to_sparse()]
    assert hardware.storage_ranges([*opaque, t]) == hardware.storage_ranges([t])
    assert len(hardware.storage_ranges([t])) == 1


@pytest.mark.parametrize("weights", ["fp32", "bf16"])
def test_decoding_on_a_cpu_backs_the_weights_with_huge_pages(weights: str) -> None:
    """A model decoding on a CPU has its weights moved onto huge pages by a thread that starts at the
    first decode step (not at a prompt's pass alone) and runs to its end, bf16 matrices included (where
    bf16 is native they hold oneDNN's packed copies: opaque tensors); the weights, and every output, stay."""
    import gptlab
    from gptlab.generate import generate_ids, prepare_decoding

    model = tiny_model(vocab_size=8192, n_embd=256)  # an 8 MB token table
    if weights == "bf16":
        gptlab.quantize(model, "bf16")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = prepare_decoding(model)
    first = generate_ids(
        model, torch.tensor([[1, 2, 3]]), 1, temperature=0.0
    )  # the prompt's pass gives the one token
    assert engine.huge_pages is None
    out = generate_ids(model, torch.tensor([[1, 2, 3]]), 4, temperature=0.0)
    assert engine.huge_pages is not None
    engine.huge_pages.join(timeout=60)
    assert not engine.huge_pages.is_alive()
    assert engine.huge_pages.backed is not None  # it ran to its end
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(generate_ids(model, torch.tensor([[1, 2, 3]]), 4, temperature=0.0), out)
    assert torch.equal(out[:, :4], first)
    reason = _collapse_expected()
    if reason is not None:
        pytest.skip(reason)
    (start, _), *_ = hardware.huge_page_spans(hardware.storage_ranges([model.wte.weight]))
    assert _huge_kb_at(start) >= hardware.HUGE_PAGE // 1024
