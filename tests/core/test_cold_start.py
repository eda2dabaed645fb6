"""What a command pays before its first token: imports it does not need, weights initialised only to be
overwritten, the compiler imported by loading. Each is a property a change could silently break."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import gptlab
from gptlab.model import INITIALISERS
from tests import ROOT

#: optional or heavy packages that neither ``import gptlab`` nor the CLI's argument parsing may import
HEAVY = ["torch", "numpy", "fastapi", "uvicorn", "matplotlib", "transformers", "lm_eval", "jinja2", "gguf"]


def _imported_after(code: str) -> list[str]:
    """The modules of ``HEAVY`` (and the compiler's) that a fresh interpreter holds after running ``code``."""
    probe = [*HEAVY, "torch._dynamo", "torch._inductor", "sympy"]
    script = (
        f"import sys\n{code}\nprint(__import__('json').dumps([m for m in {probe!r} if m in sys.modules]))"
    )
    env_path = str(ROOT / "src")
    # the CPU kind the test runs as (an imitated AVX2 one too): weights kept for it are found by its kind
    kind = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", **kind},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def test_import_gptlab_and_parsing_a_command_import_nothing_heavy():
    assert _imported_after("import gptlab") == []
    # the parser may read the data package's tables (numpy, which torch imports anyway), nothing heavier
    assert _imported_after("from gptlab.cli import build_parser; build_parser()") in ([], ["numpy"])


def test_loading_imports_no_compiler(tmp_path, tiny_model):
    """Loading (a checkpoint in each inference format, a GGUF file) imports neither torch's compiler
    nor sympy: building the model on the meta device used to, through PyTorch's reference kernels."""
    pytest.importorskip("gguf", reason="the gguf package writes GGUF files")
    from gptlab.interop.gguf_export import to_gguf
    from gptlab.tokenizers import BPETokenizer

    tok = BPETokenizer.train("hello world, the quick brown fox " * 8, vocab_size=280, pattern="gpt2")
    model = tiny_model(vocab_size=tok.vocab_size, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    ckpt = gptlab.save(model, tok, tmp_path / "ckpt")
    gguf_file = to_gguf(model, tmp_path / "m.gguf", tok)
    loads = "; ".join(
        f"gptlab.load({str(src)!r}, quantize={q!r})"
        for src in (ckpt, gguf_file)
        for q in ("fp32", "bf16", "int8")
    )
    found = _imported_after(f"import gptlab; {loads}")
    assert "torch._dynamo" not in found and "torch._inductor" not in found and "sympy" not in found, found


def test_a_kept_gguf_conversion_is_read_without_the_gguf_package(tmp_path):
    """Once ``--weights-cache`` keeps a GGUF file's conversion, a start reads that checkpoint and chooses
    its weights without importing the ``gguf`` package or the exporters (``gptlab.interop`` is lazy)."""
    pytest.importorskip("gguf", reason="the gguf package writes GGUF files")
    from gguf import GGMLQuantizationType as Q

    from gptlab.model.int4 import int4_supported
    from tests.interop._gguf import tiny_llama, write_llama

    if not int4_supported(16, 32):
        pytest.skip("this torch has no CPU int4 kernel: nothing is kept")
    path, store = tmp_path / "tiny.gguf", tmp_path / "store"
    write_llama(path, tiny_llama(), Q.Q4_1)
    gptlab.load(path, store=store)  # converts and keeps (imports gguf)
    choose = f"from gptlab.cli.options import weights_format; weights_format('auto', 'cpu', {str(path)!r}, store={str(store)!r})"
    found = _imported_after(f"import gptlab; {choose}; gptlab.load({str(path)!r}, store={str(store)!r})")
    assert "gguf" not in found, found
    assert "gguf" in _imported_after(f"import gptlab; gptlab.load({str(path)!r})")  # the probe can tell


@pytest.mark.parametrize("quantize", [None, "fp32", "bf16", "int8"])
def test_loading_draws_no_random_weights(tmp_path, tiny_model, monkeypatch, quantize):
    """Every weight is read from the file, so none is first drawn at random (seconds on 100M+ weights)."""
    ckpt = gptlab.save(tiny_model(jitter=0.1), None, tmp_path / "ckpt")
    calls: list[str] = []
    for name in INITIALISERS:
        original = getattr(torch.nn.init, name)

        def counted(tensor, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.nn.init, name, counted)
    model, _ = gptlab.load(ckpt, quantize=quantize)
    assert calls == []
    assert sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers()) > 0
    gptlab.GPT(model.config)  # the counters count: building a fresh model draws its weights
    assert "normal_" in calls


def test_warm_up_finds_one_layer_of_each_kind_and_nothing_in_a_small_model(tiny_model, monkeypatch, one_row):
    from gptlab.model import quantized
    from gptlab.model.warmup import streaming_layers, warm_up

    small = gptlab.quantize(tiny_model(), "bf16")
    assert streaming_layers(small) == [] and warm_up(small) == 0  # fits the caches: nothing compiles
    monkeypatch.setattr(quantized, "STREAM_MIN_BYTES", 0)  # as if it were large
    for fmt in ("fp32", "bf16", "int8"):
        model = gptlab.quantize(tiny_model(), fmt)
        kinds = streaming_layers(model)
        linears = [m for m in model.modules() if isinstance(m, quantized.InferenceLinear)]
        if one_row == "library":  # the library kernels need no warm-up
            assert kinds == [] and warm_up(model) == 0
        else:
            assert 1 <= len(kinds) < len(linears) and all(k.streams for k in kinds)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_after_loading_a_decode_compiles_nothing_and_says_the_same(
    tmp_path, tiny_model, monkeypatch, fmt, compiled_one_row
):
    """gptlab.load pays the one-row kernels' compilation; generating afterwards compiles no graph, and
    greedy text is what the model loaded without the warm-up says."""
    from gptlab.compiling import can_compile
    from gptlab.model import quantized
    from gptlab.tokenizers import CharTokenizer

    if not can_compile("cpu"):
        pytest.skip("no C++ compiler: the one-row kernel runs uncompiled")
    import torch._dynamo.utils

    monkeypatch.setattr(quantized, "STREAM_MIN_BYTES", 0)  # a tiny model streams as a large one does
    tok = CharTokenizer.from_text("abcdefgh ij\n", special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, pos="rope", jitter=0.05)
    ckpt = gptlab.save(model, tok, tmp_path / "ckpt")
    config = gptlab.SampleConfig(max_new_tokens=12, temperature=0)
    plain, _ = gptlab.checkpoint.load(ckpt, quantize=fmt)  # no warm-up
    expected = gptlab.generate_text(plain, tok, "abc ab", config)
    torch._dynamo.reset()
    warmed, _ = gptlab.load(ckpt, quantize=fmt)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs >= 1  # the warm-up compiled
    assert gptlab.generate_text(warmed, tok, "abc ab", config) == expected
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


@pytest.mark.slow
def test_a_gguf_file_loaded_as_it_ships_is_warmed_up_like_a_quantized_checkpoint(
    tmp_path, monkeypatch, compiled_one_row
):
    """``gptlab.load(file)`` with no format asked keeps a GGUF file's quantized weights (here Q8_0 →
    int8): the one-row kernels are paid for while loading, as for ``quantize="int8"``, so the first
    prefill does not compile them (it did: 5 s against 0.7 for the second, under the AVX2 imitation,
    while SmolLM2's Q8_0 head was int8)."""
    pytest.importorskip("gguf", reason="the gguf package writes GGUF files")
    from gguf import GGMLQuantizationType as Q

    from gptlab.compiling import can_compile
    from gptlab.generate import generate_ids
    from gptlab.model import quantized
    from tests.interop._gguf import tiny_llama, write_llama

    if not can_compile("cpu"):
        pytest.skip("no C++ compiler: the one-row kernel runs uncompiled")
    import torch._dynamo.utils

    monkeypatch.setattr(quantized, "STREAM_MIN_BYTES", 0)  # a tiny model streams as a large one does
    path = tmp_path / "q8.gguf"
    write_llama(path, tiny_llama(), Q.Q8_0)
    torch._dynamo.reset()
    model, _ = gptlab.load(path)
    assert model.quantization == "int8"
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs >= 1  # the warm-up compiled
    generate_ids(model, torch.tensor([[5, 17, 99, 3, 250, 42]]), 4, temperature=0.0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    # an int8 checkpoint loaded as it is stored (no format asked) is readied the same way
    ckpt = gptlab.save(model, None, tmp_path / "int8")
    torch._dynamo.reset()
    stored, _ = gptlab.load(ckpt)
    assert stored.quantization == "int8"
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    generate_ids(stored, torch.tensor([[5, 17, 99, 3, 250, 42]]), 4, temperature=0.0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_loading_a_model_with_no_streaming_layer_imports_no_compiler(tmp_path):
    """Where decode compiles its one-row kernel (forced here: below native bf16) only a model with a
    streaming layer imports torch's compiler while loading: a GGUF file whose every matrix and token
    table is 4-bit loads as int4 layers only and pays nothing (it had paid ~2 s for an import started
    from the file's size), nor does a Q8_0 file, whose blocks are kept as two int4 planes there
    (``gptlab.hardware.int8_blocks``; its int8 layers had paid their warm-up); the same file made int8
    per channel (``quantize="int8"``) does."""
    pytest.importorskip("gguf", reason="the gguf package writes GGUF files")
    from gguf import GGMLQuantizationType as Q

    from gptlab.compiling import can_compile
    from gptlab.model.int4 import int4_supported
    from tests.interop._gguf import tiny_llama, write_llama

    if not int4_supported(16, 32) or not can_compile("cpu"):
        pytest.skip("needs torch's CPU int4 kernel and a C++ compiler")
    four, eight = tmp_path / "q4.gguf", tmp_path / "q8.gguf"
    write_llama(four, tiny_llama(vocab_size=304), Q.Q4_0)
    write_llama(eight, tiny_llama(vocab_size=304), Q.Q8_0)
    force = (
        "import gptlab.hardware as h, gptlab.model.quantized as q; "
        "h.one_row_kernel = lambda device, machine=None: 'compiled'; q.STREAM_MIN_BYTES = 0"
    )
    found = _imported_after(
        f"import gptlab; {force}; m, _ = gptlab.load({str(four)!r}); assert m.quantization == 'int4'"
    )
    assert "torch._inductor" not in found and "torch._dynamo" not in found, found
    found = _imported_after(
        f"import gptlab; {force}; m, _ = gptlab.load({str(eight)!r}); assert m.quantization == 'int8'"
    )
    assert "torch._inductor" not in found and "torch._dynamo" not in found, found
    assert "torch._inductor" in _imported_after(
        f"import gptlab; {force}; gptlab.load({str(eight)!r}, quantize='int8')"
    )


def test_a_gguf_conversion_read_back_from_the_weights_cache_streams_as_it_did_when_made(
    tmp_path, monkeypatch, compiled_one_row
):
    """One decider for the one-row kernel: an int4 model read back from ``--weights-cache`` (an int4
    checkpoint) has the same streaming layers as the conversion it was kept from."""
    pytest.importorskip("gguf", reason="the gguf package writes GGUF files")
    from gguf import GGMLQuantizationType as Q

    from gptlab.model import quantized
    from gptlab.model.int4 import int4_supported
    from tests.interop._gguf import tiny_llama, write_llama

    if not int4_supported(16, 32):
        pytest.skip("this torch has no CPU int4 kernel: nothing is kept")
    monkeypatch.setattr(quantized, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr("gptlab.sources.warm_up", lambda model: 0)  # the flags, not the compilation
    path, store = tmp_path / "t.gguf", tmp_path / "store"
    write_llama(path, tiny_llama(), Q.Q4_1)  # a 270-row table: int8, and its tied head streams

    def flags(model):
        return [(n, m.streams) for n, m in model.named_modules() if isinstance(m, quantized.InferenceLinear)]

    made = flags(gptlab.load(path, store=store)[0])
    assert any(streams for _, streams in made)
    assert flags(gptlab.load(path, store=store)[0]) == made
