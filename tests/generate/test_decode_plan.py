"""The decode plan: one function chooses how to decode, prints why, and compiled steps are kept.

``plan_decoding(facts, settings, batch, …)`` is pure, so a fake CUDA or CPU machine is a
``ModelFacts`` built by hand; a real tiny model checks that the engine holds what it compiled and
that ``gptlab sample`` passes ``--static`` / ``GPTLAB_STATIC`` / ``GPTLAB_COMPILE`` in.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest
import torch

import gptlab
from gptlab import compiling
from gptlab.cli import main
from gptlab.generate import (
    DecodeSettings,
    ModelFacts,
    SampleConfig,
    generate_ids,
    plan_decoding,
    prepare_decoding,
    prepared_of,
)
from gptlab.generate.plan import STEPS
from gptlab.model import GPT, GPTConfig
from gptlab.tokenizers import CharTokenizer
from tests._machines import AVX2, AVX512_BF16
from tests._tiny import tiny_model

GENERATE = Path(gptlab.__file__).parent / "generate"
BIG = 538 * 2**20  # SmolLM2-135M in float32: its matrices stream from memory

CPU = ModelFacts(device="cpu", compiler=True, matrix_bytes=BIG)
CPU_NO_COMPILER = dataclasses.replace(CPU, compiler=False)
CPU_INT8 = dataclasses.replace(CPU, weights="int8")
CPU_KEPT = dataclasses.replace(CPU, kept_step=True)  # the compile cache holds its one-row step
CUDA = ModelFacts(device="cuda", compiler=True, matrix_bytes=BIG, weights="bf16", activations=torch.bfloat16)
MPS = dataclasses.replace(CUDA, device="mps")

ON, OFF, AUTO = DecodeSettings(compile="on"), DecodeSettings(compile="off"), DecodeSettings(compile="auto")
GREEDY, BEAM = SampleConfig(temperature=0), SampleConfig(beam_width=2)


@pytest.mark.parametrize(
    ("facts", "settings", "batch", "asked", "expected"),
    [
        # a CPU: layer by layer unless asked; compiled, one row fuses and batches freeze
        (CPU, DecodeSettings(), 1, {}, ("dynamic", "layers", "per-request")),
        (CPU, ON, 1, {}, ("dynamic", "fused", "per-request")),
        (CPU, ON, 4, {}, ("static", "frozen", "in-graph")),
        (CPU, ON, 4, {"want_probs": True}, ("dynamic", "layers", "per-request")),
        (CPU, ON, 1, {"cache_dtype": torch.int8}, ("dynamic", "layers", "per-request")),
        (CPU_INT8, ON, 4, {}, ("dynamic", "layers", "per-request")),  # int8 keeps its own kernels
        (CPU_NO_COMPILER, ON, 1, {}, ("dynamic", "layers", "per-request")),
        # auto runs the one-row step the compile cache keeps; it compiles it here only for a very long
        # generation, not for a short one or a session of unknown length (a server: its first
        # request would wait for the compilation)
        (CPU, dataclasses.replace(AUTO, planned_tokens=100), 1, {}, ("dynamic", "layers", "per-request")),
        (CPU, dataclasses.replace(AUTO, planned_tokens=4096), 1, {}, ("dynamic", "layers", "per-request")),
        (CPU, dataclasses.replace(AUTO, planned_tokens=10_000), 1, {}, ("dynamic", "fused", "per-request")),
        (CPU, AUTO, 1, {}, ("dynamic", "layers", "per-request")),
        (CPU_KEPT, AUTO, 1, {}, ("dynamic", "fused", "per-request")),
        (CPU_KEPT, dataclasses.replace(AUTO, planned_tokens=8), 1, {}, ("dynamic", "fused", "per-request")),
        (CPU, dataclasses.replace(AUTO, planned_tokens=100), 2, {}, ("dynamic", "layers", "per-request")),
        (CPU, DecodeSettings(compile="off", static=True), 2, {}, ("static", "eager", "in-graph")),
        (CPU, DecodeSettings(compile="on", static=False), 4, {}, ("dynamic", "layers", "per-request")),
        # CUDA: the static cache with CUDA graphs by default; anything the graph cannot sample is dynamic
        (CUDA, DecodeSettings(), 1, {}, ("static", "cuda-graphs", "in-graph")),
        (CUDA, DecodeSettings(), 8, {"config": GREEDY}, ("static", "cuda-graphs", "in-graph")),
        (CUDA, DecodeSettings(), 2, {"config": BEAM}, ("dynamic", "layers", "per-request")),
        (CUDA, DecodeSettings(), 1, {"want_probs": True}, ("dynamic", "layers", "per-request")),
        (CUDA, DecodeSettings(static=False), 8, {}, ("dynamic", "layers", "per-request")),
        (CUDA, dataclasses.replace(AUTO, planned_tokens=500), 1, {}, ("dynamic", "layers", "per-request")),
        (CUDA, OFF, 1, {}, ("dynamic", "layers", "per-request")),
        (
            dataclasses.replace(CUDA, alibi_half=True),
            DecodeSettings(),
            4,
            {},
            ("dynamic", "layers", "per-request"),
        ),
        # other devices: layer by layer, the static step eager where asked
        (MPS, DecodeSettings(), 4, {}, ("dynamic", "layers", "per-request")),
        (MPS, DecodeSettings(static=True), 4, {}, ("static", "eager", "in-graph")),
    ],
)
def test_the_plan_on_fake_machines(facts, settings, batch, asked, expected):
    plan = plan_decoding(facts, settings, batch, **asked)
    assert (plan.session, plan.step, plan.sampler) == expected
    assert plan.why and plan.batch == batch and plan.device == facts.device


def test_the_facts_follow_the_machine_and_the_model():
    """``ModelFacts.of`` reads the model (device, stored format); the CPU's bf16 support decides what
    ``quantize(model, "bf16")`` activations are, and with them whether batches freeze."""
    from unittest import mock

    config = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)
    for machine, activations, frozen in [(AVX2, torch.float32, True), (AVX512_BF16, torch.bfloat16, False)]:
        with mock.patch("gptlab.hardware.native_bf16", return_value=machine.native_bf16):
            model = gptlab.quantize(GPT(config), "bf16")
        facts = ModelFacts.of(model)
        assert (facts.device, facts.weights, facts.activations) == ("cpu", "bf16", activations)
        plan = plan_decoding(dataclasses.replace(facts, compiler=True), ON, 4)
        assert (plan.step == "frozen") is frozen, plan


def test_the_plan_prints_on_one_line_with_its_reasons():
    text = str(plan_decoding(CPU, DecodeSettings(compile="on", planned_tokens=2000), 2, want_probs=True))
    assert text.startswith("decode plan (cpu, batch 2): dynamic cache, layer by layer, per-request sampler (")
    assert "--compile on" in text and "\n" not in text
    text = str(plan_decoding(CPU, dataclasses.replace(AUTO, planned_tokens=100), 1))
    assert "layer by layer" in text and "the first token would wait a minute or more" in text
    not_kept = dataclasses.replace(CPU, kept_step=False)
    text = str(plan_decoding(not_kept, dataclasses.replace(AUTO, planned_tokens=None, compile_cache="/c"), 1))
    assert "layer by layer" in text and "the compile cache does not hold it yet" in text
    text = str(plan_decoding(CPU_KEPT, dataclasses.replace(AUTO, compile_cache="/c"), 1))
    assert "one compiled graph per token" in text and "kept for this model and machine; " in text
    assert "loaded from /c" in text
    text = str(plan_decoding(CPU, dataclasses.replace(AUTO, planned_tokens=10_000), 1))
    assert "one compiled graph per token" in text and "compiled in this process, the first step waits" in text
    text = str(plan_decoding(CPU, dataclasses.replace(AUTO, planned_tokens=10_000, compile_wait=False), 1))
    assert "compiled in this process, eager until it is ready" in text
    text = str(plan_decoding(CPU, DecodeSettings(compile="on", compile_cache="/c", compile_wait=True), 1))
    assert "kept in /c, the first step waits for it" in text
    text = str(plan_decoding(CUDA, DecodeSettings(static=False), 8))
    assert "--static off" in text


def test_a_bad_compile_setting_is_one_error():
    with pytest.raises(gptlab.GptlabError, match="--compile must be one of"):
        DecodeSettings(compile="yes")


def _tiny(**options) -> GPT:
    return tiny_model(n_layer=1, n_head=2, pos="rope", **options)


def test_a_model_decoded_twice_compiles_once():
    """The static session and its compiled step live on the model's engine: a second generation (and
    a smaller one) reuses them; dynamo traces no new frame. (The eager back-end keeps it quick.)"""
    import torch._dynamo.utils as dynamo_utils

    model = _tiny()
    options = {"backend": "eager", "fullgraph": True}
    engine = prepare_decoding(model, static=True, compile="on", compile_options=options)
    assert engine is prepared_of(model) and engine.plan(3).step == "compiled"
    idx = torch.randint(0, 61, (3, 5))
    first = generate_ids(model, idx, 6, temperature=0)
    session = engine.static
    assert session is not None and session.compiled
    frames = dynamo_utils.counters["frames"]["ok"]
    again = generate_ids(model, idx, 6, temperature=0)
    generate_ids(model, idx[:2], 4, temperature=0)
    assert engine.static is session and torch.equal(again, first)
    assert dynamo_utils.counters["frames"]["ok"] == frames  # nothing traced again
    reference = generate_ids(_tiny(), idx, 6, temperature=0)  # a fresh model: the dynamic cache
    assert prepared_of(_tiny()).static is None and torch.equal(first, reference)


def test_a_new_preparation_replaces_the_engine_and_a_copy_starts_without_one():
    model = _tiny()
    first = prepare_decoding(model, compile="on")
    assert prepared_of(model) is first and first.one_token is first.one_token  # built once
    second = prepare_decoding(model, compile="off")
    assert prepared_of(model) is second and prepared_of(model).plan(1).step == "layers"
    clone = copy.deepcopy(model)
    assert prepared_of(clone) is not second and prepared_of(clone).model is clone


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tok = CharTokenizer.from_text("abcdefgh ij\n", special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)
    return gptlab.save(model, tok, tmp_path_factory.mktemp("ckpt") / "c")


def test_sample_verbose_prints_the_plan_and_the_environment_takes_effect(ckpt, capsys, monkeypatch):
    args = ["sample", str(ckpt), "--prompt", "ab", "--max-new-tokens", "3", "--device", "cpu", "--verbose"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "decode plan (cpu, batch 1): dynamic cache, layer by layer" in err
    assert main([*args, "--static", "off"]) == 0
    assert "static cache off (static=False: --static off)" in capsys.readouterr().err
    monkeypatch.setenv("GPTLAB_STATIC", "0")  # read by the CLI: the default of --static
    assert main(args) == 0
    assert "static cache off (static=False: --static off)" in capsys.readouterr().err
    monkeypatch.delenv("GPTLAB_STATIC")
    monkeypatch.setenv("GPTLAB_COMPILE", "0")  # read by the CLI: compiling switched off, for this command
    assert main([*args, "--compile", "on"]) == 0
    err = capsys.readouterr().err
    assert "compile: off (compiling switched off" in err and "layer by layer" in err
    assert compiling.toolchain().compile  # main restored the process-wide setting


def test_gptlab_static_from_the_cli_reaches_the_plan():
    from gptlab.cli.options import prepare_decode

    model = _tiny()
    assert prepare_decode("auto", model, None, static="off").settings.static is False
    settings = prepared_of(model).settings
    assert plan_decoding(CUDA, settings, 4).session == "dynamic"  # what it means on a GPU
    assert prepare_decode("auto", model, None).settings.static is None
    assert prepare_decode("auto", model, None, static="on").settings.static is True
    assert plan_decoding(CUDA, prepared_of(model).settings, 4).session == "static"


def _imports(path: Path) -> set[str]:
    """The gptlab.generate modules ``path`` imports, at any depth (inside functions and
    TYPE_CHECKING blocks included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gptlab.generate."):
            names.add(node.module.removeprefix("gptlab.generate."))
        elif isinstance(node, ast.Import):
            names.update(
                a.name.removeprefix("gptlab.generate.")
                for a in node.names
                if a.name.startswith("gptlab.generate.")
            )
    return names


def test_generate_has_no_import_cycle_no_registry_and_reads_no_environment():
    modules = {p.stem: _imports(p) for p in GENERATE.glob("*.py") if p.stem != "__init__"}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in modules.get(name, ()):
            assert state.get(dep) != 1, f"import cycle: {' → '.join([*path, name, dep])}"
            if dep not in state:
                visit(dep, [*path, name])
        state[name] = 2

    for name in modules:
        if name not in state:
            visit(name, [])
    for path in GENERATE.glob("*.py"):
        text = path.read_text()
        assert "os.environ" not in text and "getenv" not in text, path.name
        assert "WeakKeyDictionary" not in text, path.name


def _ran_compiled(model: GPT) -> int:
    """Calls that ran through torch.compile, over every step the model's engine built (public counters)."""
    return sum(step.compiled_calls for step in prepared_of(model).compiled_steps)


@pytest.mark.parametrize("switched_off", [False, True], ids=["compiling", "GPTLAB_COMPILE=0"])
@pytest.mark.parametrize(
    "asked",
    [
        None,
        "off",
        "auto",
        pytest.param("on", marks=pytest.mark.slow),  # a cold compile of the one-row step
    ],
)
def test_the_printed_plan_is_what_runs(asked, switched_off):
    """For every compile setting, with compiling switched on and off (what ``GPTLAB_COMPILE=0``
    sets, through the CLI): a plan that says compiled ran compiled, one that says layer by layer
    ran nothing compiled. (``prepare_decoding(model, compile="on")`` under ``GPTLAB_COMPILE=0``
    printed "one compiled graph per token" and ran layer by layer.)"""
    model = _tiny()
    previous = compiling.configure(compile=not switched_off)
    try:
        plan = prepare_decoding(model, compile=asked, compile_wait=True).plan(1)
        out = generate_ids(model, torch.tensor([[1, 2, 3]]), 4, temperature=0)
    finally:
        compiling.configure(compile=previous.compile, cxx=previous.cxx)
    said_compiled = "compiled" in STEPS[plan.step]  # what the printed line says the step is
    assert STEPS[plan.step] in str(plan) and said_compiled == (plan.step == "fused")
    assert said_compiled == (_ran_compiled(model) > 0), str(plan)
    if switched_off or asked in (None, "off"):
        assert plan.step == "layers" and not said_compiled
    if switched_off and asked == "on":
        assert "switched off" in plan.why
    assert out.shape == (1, 7)


def test_compile_on_with_compiling_switched_off_plans_and_runs_layer_by_layer():
    """The issue's case, fast: the library reads no GPTLAB_COMPILE; the switch is a setting the plan sees."""
    model = _tiny()
    previous = compiling.configure(compile=False)
    try:
        engine = prepare_decoding(model, compile="on")
        assert engine.plan(1).step == "layers" and "switched off" in str(engine.plan(1))
        assert "compiled" not in STEPS[engine.plan(1).step]
        assert engine.plan(4).step == "layers"  # and no frozen batch step either
        generate_ids(model, torch.tensor([[1, 2], [3, 4]]), 3, temperature=0)
        generate_ids(model, torch.tensor([[1, 2]]), 3, temperature=0)
        assert _ran_compiled(model) == 0
    finally:
        compiling.configure(compile=previous.compile, cxx=previous.cxx)


def test_the_cli_keeps_compiled_steps_in_the_users_cache_unless_told_otherwise(tmp_path):
    from gptlab.cli.options import default_compile_cache, prepare_decode

    assert default_compile_cache({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "gptlab" / "compiled")
    assert default_compile_cache({}).endswith(str(Path(".cache") / "gptlab" / "compiled"))
    model = _tiny()
    assert prepare_decode("on", model, None, compile_cache=str(tmp_path)).settings.compile_cache == str(
        tmp_path
    )
    assert prepare_decode("on", model, None, compile_cache="none").settings.compile_cache is None
    args = ["sample", "unused", "--compile-cache", str(tmp_path)]
    from gptlab.cli import build_parser

    parsed = build_parser().parse_args(args)
    assert parsed.compile_cache == str(tmp_path) and parsed.static == "auto"


def test_the_plan_names_the_one_row_kernel_that_runs(one_row, monkeypatch):
    """A CPU's layer-by-layer plan says how one row is multiplied, and that is what runs: through the
    compiled kernel dynamo compiles frames at the first decode; through the library kernels none."""
    import torch._dynamo.utils as dynamo_utils

    from gptlab.compiling import can_compile
    from gptlab.model import quantized

    monkeypatch.setattr(quantized, "STREAM_MIN_BYTES", 0)  # a tiny model streams as a large one does
    model = gptlab.quantize(tiny_model(n_layer=1, n_head=2, vocab_size=64, block_size=16), "int8")
    compiled = one_row == "compiled" and can_compile("cpu")
    text = str(prepare_decoding(model, compile="off").plan(1))
    expected = "compiled one-row kernel" if compiled else "one row through the library kernels"
    assert expected in text, text
    torch._dynamo.reset()
    frames = dynamo_utils.counters["frames"]
    before = frames["ok"]
    generate_ids(model, torch.tensor([[1, 2, 3]]), 3, temperature=0)
    assert (frames["ok"] > before) is compiled
