"""The compiled decode step (``gptlab.generate.one_token``) computes what the layer-by-layer step does."""

from __future__ import annotations

import pytest
import torch

import gptlab
from gptlab import compiling
from gptlab.compiling import can_compile
from gptlab.generate import generate_ids, prepared_of
from gptlab.generate.plan import ModelFacts
from gptlab.model import GPT
from tests.generate._fused import fused_model, greedy_logits

needs_compiler = pytest.mark.skipif(not can_compile("cpu"), reason="no C++ compiler for torch.compile")

VARIANTS = {
    # gpt2's shape: learned positions, LayerNorm, GELU, biases
    "learned": dict(pos="learned"),
    # relative positions slide past the context; GQA stores 2 KV heads for 4 query heads
    "rope-gqa-rmsnorm-swiglu": dict(pos="rope", n_kv_head=2, norm="rmsnorm", mlp="swiglu", qk_norm=True),
    "alibi-mqa": dict(pos="alibi", n_kv_head=1, bias=False),
}


@pytest.mark.slow  # one cold compile per variant: 20-40 s each on 2 busy cores
@needs_compiler
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_compiled_step_equals_the_layer_by_layer_step(monkeypatch, variant):
    model = fused_model("fp32", **VARIANTS[variant])
    # 5 prompt tokens and 30 steps: past the context of 24, so RoPE and ALiBi slide (the cache's
    # end moves back) and learned positions stop at the limit
    steps = 30 if variant != "learned" else 24 - 5
    fused = greedy_logits(model, [3, 1, 4, 1, 5], steps, True, monkeypatch)
    layered = greedy_logits(model, [3, 1, 4, 1, 5], steps, False, monkeypatch)
    for t, (a, b) in enumerate(zip(fused, layered, strict=True)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (variant, t, (a - b).abs().max())


@needs_compiler
@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_compiled_half_and_int8_steps_agree_with_the_layer_by_layer_step(monkeypatch, fmt):
    model = fused_model(fmt)
    fused = greedy_logits(model, [3, 1, 4, 1, 5], 8, True, monkeypatch)
    layered = greedy_logits(model, [3, 1, 4, 1, 5], 8, False, monkeypatch)
    for a, b in zip(fused, layered, strict=True):  # bf16 activations: agreement to bf16 precision
        assert (a - b).abs().max() <= 2e-2 * b.abs().max()
        assert a.argmax() == b.argmax()


@needs_compiler
def test_compiled_step_compiles_once_for_every_cache_length(monkeypatch):
    import torch._dynamo.utils as dynamo_utils

    model = fused_model("int8")
    frames = dynamo_utils.counters["frames"]
    assert generate_ids(model, torch.tensor([[1, 2, 3]]), 3, temperature=0).shape == (1, 6)  # cache ends 4..6
    assert prepared_of(model).one_token.compiled_calls > 0  # it ran compiled
    before = frames["ok"]
    assert generate_ids(model, torch.tensor([list(range(8))]), 16, temperature=0).shape == (
        1,
        24,
    )  # ends 9..24
    assert frames["ok"] == before  # nothing new compiled: the cache length is a symbol, not a constant


@needs_compiler
def test_the_compiled_step_is_used_only_where_it_applies(monkeypatch):
    model = fused_model("bf16")
    engine = prepared_of(model)
    assert engine.plan(1).step == "fused"
    assert engine.dynamic_session(engine.plan(1), 1).one_token is engine.one_token
    # several rows: bf16 weights with bf16 activations (native bf16) keep the batched kernels; with
    # float32 activations (a CPU that emulates bf16, e.g. AVX2) they take the frozen static step
    several = engine.plan(2)
    native = ModelFacts.of(model).activations != torch.float32
    assert several.step == ("layers" if native else "frozen"), several
    if several.session == "dynamic":
        assert engine.dynamic_session(several, 2).one_token is None
    int8_cache = engine.plan(1, cache_dtype=torch.int8)
    assert int8_cache.step == "layers"  # an int8 cache dequantises on reads
    assert engine.dynamic_session(int8_cache, 1, cache_dtype=torch.int8).one_token is None  # as planned
    assert prepared_of(gptlab.quantize(GPT(model.config), "bf16")).plan(1).step == "layers"  # not asked for
    previous = compiling.configure(compile=False)  # what GPTLAB_COMPILE=0 sets: the step runs eagerly
    try:
        off = gptlab.prepare_decoding(gptlab.quantize(GPT(model.config), "bf16"), compile="on")
        assert off.plan(1).step == "layers"
        assert off.dynamic_session(off.plan(1), 1).one_token is None
    finally:
        compiling.configure(compile=previous.compile, cxx=previous.cxx)
