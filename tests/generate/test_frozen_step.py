"""The CPU's compiled static step: weights frozen into the graph, one compilation for every session.

``StaticSession(step="frozen")`` on a CPU compiles ``FrozenStep`` with inductor's freezing and its
C++ GEMM (``gptlab.generate.static``). These tests compile a tiny model for real (tens of
seconds on 2 cores: the GEMM autotuning benchmarks each shape), so they are ``slow``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gptlab.compiling import Compiled, can_compile
from gptlab.generate.config import SampleConfig
from gptlab.generate.prepared import prepare_decoding, prepared_of
from gptlab.generate.static import FROZEN, FrozenStep, FrozenSteps, StaticSession
from tests.generate._static import PROMPTS, alone, run, tiny

PACKED, TEMPLATED = "mkldnn_linear_weight_pack_matcher_count", "cpp_templated_kernel_counter"
needs_compiler = pytest.mark.skipif(not can_compile("cpu"), reason="no C++ compiler for torch.compile")


def _no_fallback():
    w = warnings.catch_warnings()
    w.__enter__()
    warnings.filterwarnings("error", message=".*torch.compile failed")  # a silent eager run fails here
    return w


@pytest.mark.slow
@needs_compiler
def test_frozen_step_agrees_holds_its_own_weights_and_recompiles_when_they_change(monkeypatch):
    from torch._dynamo.utils import counters

    # The step autotunes between inductor's C++ GEMM and ATen's by timing each shape, so which one
    # wins depends on the machine and its load (on a busy 2-core VM, ATen won 3 of these 5 tiny
    # shapes once). Offered the C++ GEMM alone, the count below is a property of the code.
    monkeypatch.setitem(FROZEN, "max_autotune_gemm_backends", "CPP")
    model = tiny(pos="rope", n_kv_head=2, n_layer=1, block_size=64)
    want = {i: alone(model, p, 6) for i, p in enumerate(PROMPTS[:3])}
    steps = FrozenSteps(model)  # what the model's PreparedDecoding holds: shared by its sessions
    session = StaticSession(model, 4, 40, step="frozen", frozen=steps)
    assert session.frozen is steps and not session.prefill_step.enabled  # a CPU: eager prefill, frozen step
    packed, templated = (counters["inductor"][k] for k in (PACKED, TEMPLATED))
    w = _no_fallback()
    try:
        got = run(session, PROMPTS[:3], 6)
        assert session.compiled
        # frozen for real: inductor packed the 5 matrices (qkv, proj, two MLP, the head) at compile
        # time and generated its C++ GEMM for them (without freezing it would do neither)
        assert counters["inductor"][PACKED] - packed == 5
        assert counters["inductor"][TEMPLATED] - templated == 5
        assert sorted(got.values()) == sorted(want.values())  # slots are numbered from 0 in order
        assert [got[s] for s in sorted(got)] == [want[i] for i in range(3)]
        traced = counters["stats"]["unique_graphs"]

        # another session of the model (other rows, another length) reuses the compiled step
        other = StaticSession(model, 2, 50, step="frozen", frozen=steps)
        again = run(other, PROMPTS[3:5], 4)
        assert counters["stats"]["unique_graphs"] == traced
        assert [again[s] for s in sorted(again)] == [alone(model, p, 4) for p in PROMPTS[3:5]]

        # an ordinary in-place write moves the version counter: the next step compiles again
        step = steps.get("greedy")
        assert steps.get("greedy") is step  # kept while the weights are the ones it froze
        with torch.no_grad():
            next(model.parameters()).mul_(0.5)
        assert step.fn.stale()
        changed = run(StaticSession(model, 4, 40, step="frozen", frozen=steps), PROMPTS[:1], 6)
        assert steps.get("greedy") is not step
        assert list(changed.values())[0] == alone(model, PROMPTS[0], 6)
    finally:
        w.__exit__(None, None, None)


def test_one_sequence_keeps_the_dynamic_path_and_batches_take_the_static_one():
    model = tiny()
    engine = prepare_decoding(model, compile="on")
    greedy = SampleConfig(temperature=0, max_new_tokens=4)
    one, two = engine.plan(1, config=greedy), engine.plan(2, config=greedy)
    if can_compile("cpu"):
        assert (one.session, one.step) == ("dynamic", "fused")
        assert (two.session, two.step, two.sampler) == ("static", "frozen", "in-graph")
    engine = prepare_decoding(model, static=True, compile="off")
    assert (engine.plan(1, config=greedy).session, engine.plan(1).step) == ("static", "eager")


@pytest.mark.parametrize(("weights", "static"), [("fp32", True), ("bf16", True), ("int8", False)])
def test_compile_on_a_cpu_sends_batches_of_float32_activations_to_the_frozen_step(weights, static, capsys):
    from unittest import mock

    from gptlab.cli.options import prepare_decode
    from gptlab.model.weight_formats import quantize

    with mock.patch("gptlab.hardware.native_bf16", return_value=False):  # bf16 emulated: float32 activations
        model = quantize(tiny(), weights)
    engine = prepare_decode("on", model, planned_tokens=100)
    assert engine is prepared_of(model)
    on = engine.plan(1).step == "fused"
    assert on == can_compile("cpu")
    batches = engine.plan(4)
    assert (batches.session, batches.step) == (
        ("static", "frozen") if on and static else ("dynamic", "layers")
    )
    assert "compile: " in capsys.readouterr().err


def test_compiled_settings_hold_while_it_runs_and_are_restored_after():
    import torch._inductor.config as inductor
    import torch.fx.experimental._config as fx

    before = (inductor.freezing, fx.use_duck_shape)
    c = Compiled(lambda x: x, "a test", True, patch=FROZEN, distinct_sizes=True)
    with c.held_settings():
        assert inductor.freezing and inductor.max_autotune and not fx.use_duck_shape
    assert (inductor.freezing, fx.use_duck_shape) == before
    plain = Compiled(lambda x: x, "a test", True)
    with plain.held_settings():
        assert (inductor.freezing, fx.use_duck_shape) == before


def test_the_frozen_step_module_notices_an_in_place_write():
    model = tiny()
    step = FrozenStep(model)
    assert not step.stale()
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert step.stale()


@pytest.mark.parametrize(
    ("requested", "planned", "weights", "expected"),
    [
        ("on", 10, "fp32", True),  # asked for
        ("auto", None, "fp32", True),  # a long-lived session: the server, chat
        ("auto", 8192, "fp32", True),  # enough tokens to pay back ~90 s of compilation
        ("auto", 8191, "fp32", False),
        ("on", None, "bf16", True),  # bf16 matrices, float32 activations (bf16 emulated)
        ("on", None, "bf16-native", False),  # bf16 activations: not measured with the frozen GEMM
        ("on", None, "int8", False),
        ("auto", None, "fp32-avx512", False),  # 1.27x there: short of what a minute of compiling must earn
        ("on", None, "fp32-avx512", True),  # asked for: obeyed anywhere
    ],
)
def test_when_batches_take_the_frozen_step(requested, planned, weights, expected):
    from gptlab.generate.plan import frozen_batches_pay

    act = torch.bfloat16 if weights == "bf16-native" else torch.float32
    cpu = "AVX512" if weights.endswith("-avx512") else "AVX2"
    kind = weights.removesuffix("-native").removesuffix("-avx512")
    got, why = frozen_batches_pay(requested, planned, kind, act, cpu)
    assert got is expected and why.startswith("batches")
