"""``--compile auto`` for decoding: one pure function of what the machine and the model report."""

from __future__ import annotations

import pytest
import torch

from gptlab.compiling import can_compile
from gptlab.errors import GptlabError
from gptlab.generate.plan import (
    CUDA_PAYBACK_TOKENS,
    DecodeSettings,
    ModelFacts,
    compiles_for_later,
    decode_compile_pays,
    matrix_bytes,
    plan_decoding,
)
from gptlab.model.quantized import STREAM_MIN_BYTES
from tests._tiny import tiny_model

BIG = 538 * 2**20  # SmolLM2-135M in float32


@pytest.mark.parametrize(
    ("requested", "device", "compiler", "weights", "planned", "expected"),
    [
        ("auto", "cpu", True, BIG, None, False),  # a server: its first request would wait for the compile
        ("auto", "cpu", True, BIG, 10_000, True),  # a generation long enough to pay back waiting
        ("auto", "cpu", True, BIG, 4096, False),
        ("auto", "cpu", True, BIG, 8, False),
        ("auto", "cpu", True, STREAM_MIN_BYTES - 1, None, False),  # a small model gains nothing
        ("auto", "cpu", False, BIG, None, False),  # no C++ compiler
        ("auto", "cuda", True, BIG, None, True),  # CUDA graphs for a long-lived session
        ("auto", "cuda", True, BIG, CUDA_PAYBACK_TOKENS, True),
        ("auto", "cuda", True, BIG, 500, False),  # 500 tokens do not pay back ≈ 50 s of compiling
        ("on", "cuda", True, 1024, 1, True),  # obeyed whatever the size
        ("on", "cuda", False, BIG, None, False),  # compiling switched off (no C++ compiler is no bar there)
        ("off", "cuda", True, BIG, None, False),
        ("auto", "mps", True, BIG, None, False),
        ("on", "cpu", True, 1024, 1, True),  # obeyed whatever the size
        ("on", "cpu", False, BIG, None, False),  # ... but it cannot compile without a compiler
        ("off", "cpu", True, BIG, None, False),
    ],
)
def test_decode_compile_choice(requested, device, compiler, weights, planned, expected):
    on, why = decode_compile_pays(requested, device, compiler, weights, planned)
    assert on is expected
    assert why  # every choice says why


@pytest.mark.parametrize(
    ("compiler", "weights", "kept", "on", "later"),
    [
        (
            True,
            BIG,
            True,
            True,
            False,
        ),  # kept for this model and machine: loaded, compiled from the first token
        (True, BIG, False, False, True),  # not kept yet: layer by layer now, compiled for later processes
        (True, BIG, None, False, False),  # no compile cache: nothing to keep it in
        (True, STREAM_MIN_BYTES - 1, True, False, False),  # a small model gains nothing, kept or not
        (True, STREAM_MIN_BYTES - 1, False, False, False),
        (False, BIG, True, False, False),  # no C++ compiler: nothing loads or compiles
        (False, BIG, False, False, False),
    ],
)
def test_auto_on_a_cpu_loads_a_kept_step_and_otherwise_compiles_it_for_later(
    compiler, weights, kept, on, later
):
    """``--compile auto`` never makes a first token wait: it loads the one-row step the compile cache
    holds, and else decodes layer by layer while ``compiles_for_later`` asks for the step in the background."""
    facts = ModelFacts(
        device="cpu", compiler=compiler, matrix_bytes=BIG if weights == BIG else weights, kept_step=kept
    )
    settings = DecodeSettings(compile="auto", planned_tokens=8, compile_cache=None if kept is None else "/c")
    plan = plan_decoding(facts, settings, 1)
    assert (plan.step == "fused") is on
    assert compiles_for_later(facts, settings) is later
    if on:
        assert "kept for this model" in plan.why and "loaded from /c" in plan.why
    assert decode_compile_pays("auto", "cpu", compiler, weights, 8, kept=kept)[0] is on
    # asked for or switched off, the choice does not depend on the cache
    assert compiles_for_later(facts, DecodeSettings(compile="on", compile_cache="/c")) is False
    assert compiles_for_later(facts, DecodeSettings(compile="off", compile_cache="/c")) is False


def test_bf16_weights_on_an_emulating_cpu_compute_in_float32_so_their_step_compiles():
    """bf16 activations made the compiled step 3× slower on an AVX2 CPU; with float32 activations
    (what ``quantize(model, "bf16")`` gives there) it is the fastest format, so auto compiles it."""
    from unittest import mock

    import gptlab
    from gptlab.cli.options import prepare_decode

    model = tiny_model(vocab_size=64, block_size=16, n_layer=1, n_head=2)
    with mock.patch("gptlab.hardware.native_bf16", return_value=False):
        gptlab.quantize(model, "bf16")
        assert model.wte.weight.dtype == torch.float32  # activations in float32 ...
    linear = next(m for m in model.modules() if type(m).__name__ == "PackedBF16Linear")
    assert linear.weight.dtype == torch.bfloat16  # ... bf16 matrices
    with mock.patch("gptlab.generate.plan.STREAM_MIN_BYTES", 0):  # as if the model were large
        on = prepare_decode("on", model, planned_tokens=8).plan(1).step == "fused"
    assert on is can_compile("cpu")


def test_a_bad_choice_is_one_error():
    with pytest.raises(GptlabError, match="--compile must be one of"):
        decode_compile_pays("yes", "cpu", True, BIG, None)


def test_matrix_bytes_counts_tied_weights_once_and_follows_the_stored_format():
    import gptlab

    model = tiny_model(vocab_size=64, block_size=16, n_layer=1, n_head=2)
    assert model.config.tie_embeddings
    fp32 = matrix_bytes(model)
    expected = sum(p.numel() * 4 for p in {id(p): p for p in model.parameters() if p.dim() == 2}.values())
    assert fp32 == expected
    gptlab.quantize(model, "int8")
    assert matrix_bytes(model) < fp32  # int8 block matrices: a quarter of their float32 bytes


@pytest.mark.parametrize(("requested", "planned", "static"), [("auto", 500, False), ("auto", None, True)])
def test_on_cuda_the_choice_is_the_static_paths_graphs_and_is_said(requested, planned, static):
    """``gptlab sample`` on a GPU: a short generation does not wait ≈ 50 s for CUDA graphs."""
    cuda = ModelFacts(device="cuda", compiler=True, matrix_bytes=BIG, activations=torch.bfloat16)
    plan = plan_decoding(cuda, DecodeSettings(compile=requested, planned_tokens=planned), 1)
    assert (plan.session, plan.step) == (("static", "cuda-graphs") if static else ("dynamic", "layers"))
    assert str(plan).startswith("decode plan (cuda, batch 1): ") and "\n" not in str(plan)
    assert ("do not pay back" in plan.why) is not static  # the reason is said


def test_training_compile_auto_follows_the_device_the_precision_and_the_strategy(monkeypatch):
    """``compile = "auto"`` (the ``reference`` and ``gpt2-speedrun`` recipes): compiled on a GPU and
    under bf16 on a CPU, eager in float32 on a CPU, under FSDP and without a C++ compiler."""
    import dataclasses

    from gptlab import hardware
    from gptlab.train import precision
    from gptlab.train.config import build_config
    from tests._machines import AVX2, AVX512_BF16, CUDA_BF16

    cfg = build_config("reference")
    assert cfg.compile == "auto"
    for machine, device, expected in [
        (AVX2, "cpu", False),
        (AVX512_BF16, "cpu", True),
        (CUDA_BF16, "cuda:0", True),
    ]:
        monkeypatch.setattr(hardware, "detect", lambda m=machine: m)
        resolved, record = precision.resolve(cfg, device, 64)
        assert resolved.compile is expected and record["compile"] is expected
        assert record["requested"]["compile"] == "auto"
    monkeypatch.setattr(hardware, "detect", lambda: CUDA_BF16)
    fsdp = dataclasses.replace(cfg, strategy="fsdp")
    assert precision.resolve(fsdp, "cuda:0", 64)[0].compile is False  # FSDP runs uncompiled here
    monkeypatch.setattr(hardware, "detect", lambda: AVX512_BF16)
    monkeypatch.setattr(precision, "can_compile", lambda device_type: False)  # no C++ compiler
    assert precision.resolve(cfg, "cpu", 64)[0].compile is False
    assert (
        precision.resolve(dataclasses.replace(cfg, compile=True), "cpu", 64)[0].compile is True
    )  # asked for
    for bad in ("compile=1", "compile=maybe"):
        with pytest.raises(GptlabError, match="compile must be true, false or auto"):
            build_config("reference", [bad])
