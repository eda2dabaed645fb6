"""A prompt's pass kept compiled beside the one-row step (``gptlab.generate.prompt_pass``).

Properties: the plan says when it runs and the session then runs it (prompts of ``MIN_TOKENS`` or more,
one row from position 0, no cached prefix), with the eager pass's logits and cache; a damaged, foreign
or failing package costs a warning and runs the eager pass; ``--compile auto`` compiles it for later
processes where the cache keeps the step without it. The slow test compiles real packages.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import gptlab
from gptlab.compiling import can_compile
from gptlab.generate import generate_ids, prepare_decoding, prepared_of
from gptlab.generate.plan import DecodeSettings, ModelFacts, compiles_for_later, plan_decoding
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.prompt_pass import MIN_TOKENS, PROMPT, KeptPrompt, applies, keep_prompt_pass, prompt_pass
from gptlab.model.int4 import INT4_DEQUANT_ROWS
from gptlab.model.kvcache import default_cache_dtype
from gptlab.model.quantized import INT8_FLOAT_ROWS
from tests._kept import keep_a_recording_prompt, keep_a_recording_step
from tests._tiny import tiny_model

needs_compiler = pytest.mark.skipif(not can_compile("cpu"), reason="no C++ compiler for torch.compile")


def _model(**overrides) -> torch.nn.Module:
    shape = dict(vocab_size=61, block_size=256, n_layer=2, n_head=4, n_embd=32, pos="rope", norm="rmsnorm")
    return tiny_model(**{**shape, **overrides})


def _prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 61, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def large(monkeypatch):
    """The plan treats the tiny model as one whose matrices stream, on a CPU with a compiler."""
    monkeypatch.setattr("gptlab.generate.plan.STREAM_MIN_BYTES", 0)
    monkeypatch.setattr("gptlab.generate.plan.compile_blocker", lambda device: None)


FACTS = ModelFacts(device="cpu", compiler=True, matrix_bytes=1 << 30, kept_step=True, kept_prompt=True)


@pytest.mark.parametrize(
    "facts, settings, cache_dtype, expected",
    [
        (FACTS, DecodeSettings("auto", compile_cache="c"), None, "kept"),
        (FACTS, DecodeSettings("on", compile_cache="c"), None, "kept"),
        (FACTS, DecodeSettings("off", compile_cache="c"), None, "eager"),  # --compile off: nothing compiled
        (FACTS, DecodeSettings("auto", compile_cache="c"), torch.int8, "eager"),  # an int8 cache
        (
            dataclasses.replace(FACTS, kept_prompt=False),
            DecodeSettings("auto", compile_cache="c"),
            None,
            "eager",
        ),
        (
            dataclasses.replace(FACTS, compiler=False),
            DecodeSettings("auto", compile_cache="c"),
            None,
            "eager",
        ),
        (dataclasses.replace(FACTS, device="cuda"), DecodeSettings("auto", compile_cache="c"), None, "eager"),
    ],
)
def test_the_plan_takes_the_kept_prompt_pass_where_the_kept_step_would_run(
    facts, settings, cache_dtype, expected
):
    # the server's session of several rows prefills a lone prompt the same way (under --compile on a
    # batch of float32 weights takes the static cache, which prefills its own way)
    for batch in (1, 4) if settings.compile == "auto" else (1,):
        plan = plan_decoding(facts, settings, batch, cache_dtype=cache_dtype)
        assert plan.prompt == expected
        assert ("prompts of 128+ tokens through the kept compiled pass" in str(plan)) == (expected == "kept")


def test_auto_compiles_the_prompt_pass_for_later_where_the_cache_keeps_only_the_step():
    settings = DecodeSettings("auto", compile_cache="c")
    assert compiles_for_later(dataclasses.replace(FACTS, kept_prompt=False), settings)
    assert compiles_for_later(dataclasses.replace(FACTS, kept_step=False, kept_prompt=None), settings)
    assert not compiles_for_later(FACTS, settings)
    assert not compiles_for_later(dataclasses.replace(FACTS, kept_prompt=None), settings)  # none applies


def test_a_prompt_pass_applies_to_a_decoder_whose_context_holds_a_long_prompt():
    assert applies(_model()) and not applies(_model(block_size=64))
    assert applies(gptlab.quantize(_model(), "int4")) and applies(_model().to(torch.bfloat16))
    # int8 weights with float32 activations (the activations int8 takes on this CPU kind, or as if so):
    # measured slower compiled (1.05x), not kept
    int8 = gptlab.quantize(_model(), "int8")
    assert applies(int8) == (int8.dtype != torch.float32)
    int8.quantization = "int8"
    assert not applies(int8.float()) and applies(int8.to(torch.bfloat16))
    # one path for every layer: the int4 and int8 few-row kernels end below MIN_TOKENS rows
    assert MIN_TOKENS >= max(INT4_DEQUANT_ROWS.values())
    assert MIN_TOKENS >= max(max(rows) for rows in INT8_FLOAT_ROWS.values())


def test_the_eager_prompt_pass_is_the_sessions_prefill():
    """``prompt_pass`` (what is exported) gives the logits and cache rows of the session's own prefill."""
    model, ids = _model(), _prompt(150)
    prepare_decoding(model, compile="off")
    session = prepared_of(model).dynamic_session(prepared_of(model).plan(1), 1, capacity=200)
    slot, logits = session.add(ids)
    keys = [torch.zeros(1, 4, 200, 8) for _ in range(2)]
    values = [torch.zeros(1, 4, 200, 8) for _ in range(2)]
    with torch.inference_mode():
        out = prompt_pass(model, torch.tensor([ids]), torch.arange(150), keys, values)
    torch.testing.assert_close(out[0], logits, rtol=1e-6, atol=1e-6)
    for k, store in zip(keys, session.stores, strict=True):
        torch.testing.assert_close(k[0, :, :150], store.k[slot, :, :150], rtol=1e-6, atol=1e-6)


def test_the_session_runs_what_the_plan_says_for_each_prompt(tmp_path, large):
    """Kept: a prompt of MIN_TOKENS or more from position 0 goes through the kept pass (once), a shorter
    one and one after a cached prefix through the eager pass; the same greedy tokens as ``--compile off``."""
    model = _model()
    engine = prepare_decoding(model, compile="auto", compile_cache=tmp_path)
    keep_a_recording_step(model, tmp_path)
    assert engine.plan(1).prompt == "eager"  # the step alone is kept
    calls = keep_a_recording_prompt(model, tmp_path)
    assert engine.plan(1).prompt == "kept" and engine.facts().kept_prompt
    long, short = _prompt(MIN_TOKENS + 20), _prompt(MIN_TOKENS - 1, seed=1)
    kept = [generate_ids(model, torch.tensor([p]), 6, temperature=0)[0].tolist() for p in (long, short)]
    assert calls == [MIN_TOKENS + 20]
    assert engine.prompts_ran() == f"prompt pass ran: compiled 1 (loaded from {tmp_path})"
    session = engine.dynamic_session(engine.plan(1), 1, prefix_cache=PrefixCache(1 << 26, block_tokens=16))
    session.add(long)
    session.remove(0)
    session.add(long + _prompt(20, seed=2))  # its first blocks come from the prefix cache: eager
    assert calls == [MIN_TOKENS + 20, MIN_TOKENS + 20]
    prepare_decoding(model, compile="off")
    assert kept == [
        generate_ids(model, torch.tensor([p]), 6, temperature=0)[0].tolist() for p in (long, short)
    ]


def test_a_server_takes_up_a_prompt_pass_kept_since_it_started(tmp_path, large):
    from gptlab.serve.lanes import RECHECK_S, Lanes

    model = _model()
    prepare_decoding(model, compile="auto", compile_cache=tmp_path)
    keep_a_recording_step(model, tmp_path)
    lanes = Lanes(model, 2, vocab=61)
    assert lanes.dynamic.one_token is not None and lanes.dynamic.prompt is None
    keep_a_recording_prompt(model, tmp_path)
    assert lanes.adopt_kept_step(now=lanes._checked + RECHECK_S + 1)
    assert lanes.dynamic.prompt is prepared_of(model).prompt and lanes.plan.prompt == "kept"


def test_a_damaged_foreign_or_failing_package_runs_the_eager_pass(tmp_path, large):
    model, ids = _model(), _prompt(MIN_TOKENS + 4)
    prepare_decoding(model, compile="auto", compile_cache=tmp_path)
    keep_a_recording_prompt(model, tmp_path)
    folder = prepared_of(model).step_folder()
    keys = [torch.zeros(1, 4, 200, 8) for _ in range(2)]
    args = (model, torch.tensor([ids]), torch.arange(len(ids)), keys, [k.clone() for k in keys])
    with torch.inference_mode():
        eager = prompt_pass(*args)
        record = json.loads((folder / PROMPT.record).read_text())
        for damage in ("checksum", "key"):
            edited = dict(record, sha256="0" * 64) if damage == "checksum" else dict(record, key={"cpu": "x"})
            (folder / PROMPT.record).write_text(json.dumps(edited))
            kept = KeptPrompt(tmp_path)
            with pytest.warns(UserWarning, match="stored prompt pass .* is not used"):
                out = kept(*args)
            assert torch.equal(out, eager) and (kept.kept_calls, kept.eager_calls) == (0, 1)

        def broken(*a):
            raise RuntimeError("a package that cannot run here")

        kept = KeptPrompt(tmp_path)
        kept._run, kept._tried = broken, True
        with pytest.warns(UserWarning, match="the kept prompt pass failed"):
            assert torch.equal(kept(*args), eager)
        assert torch.equal(kept(*args), eager) and kept.eager_calls == 2 and kept.failure is not None


@pytest.mark.slow  # two ahead-of-time compilations of the tiny pass: 15-40 s each on 2 cores
@needs_compiler
@pytest.mark.parametrize("weights", ["float32", "bf16", "int8", "int4"])
def test_a_kept_prompt_pass_gives_the_eager_pass_logits_and_cache(tmp_path, weights):
    """The real package (exported, compiled by AOTInductor, loaded and verified) on prompts of several
    lengths and cache capacities: the eager pass's logits and cache rows, to float32 rounding (float32
    activations) or bf16 precision; a prompt outside what was exported runs eagerly."""
    model = _model(n_embd=64, jitter=0.02)
    if weights == "bf16":
        model = model.to(torch.bfloat16)
    elif weights in ("int8", "int4"):
        model = gptlab.quantize(model, weights)
    dtype = default_cache_dtype(model.dtype, model.device)
    assert keep_prompt_pass(model, tmp_path, dtype) == (True, "compiled")
    assert keep_prompt_pass(model, tmp_path, dtype) == (True, "kept already")
    kept = KeptPrompt(tmp_path)
    tolerance = 1e-4 if model.dtype == torch.float32 else 3e-2
    with torch.inference_mode():
        for t, capacity in ((MIN_TOKENS, MIN_TOKENS), (200, 256), (256, 300)):
            ids, pos = torch.tensor([_prompt(t, seed=t)]), torch.arange(t)
            rows = [[torch.zeros(1, 4, capacity, 16, dtype=dtype) for _ in range(2)] for _ in range(4)]
            out, eager = kept(model, ids, pos, *rows[:2]), prompt_pass(model, ids, pos, *rows[2:])
            scale = eager.abs().max()
            assert (out - eager).abs().max() <= tolerance * scale, (t, (out - eager).abs().max())
            for a, b in zip(rows[0] + rows[1], rows[2] + rows[3], strict=True):
                assert (a - b).abs().max() <= tolerance * max(b.abs().max(), 1)
        assert kept.kept_calls == 3 and kept.eager_calls == 0
        short = torch.tensor([_prompt(MIN_TOKENS - 1)])
        kept(model, short, torch.arange(MIN_TOKENS - 1), *rows[:2])
        assert kept.eager_calls == 1
    if weights == "float32":  # a damaged package is not taken for a kept one: compiled again
        package = KeptPrompt(tmp_path).store.place(model, dtype) / PROMPT.package
        package.write_bytes(package.read_bytes()[:-1] + b"!")
        with pytest.warns(UserWarning, match="gptlab compile replaces it"):
            assert keep_prompt_pass(model, tmp_path, dtype) == (True, "compiled")


@pytest.mark.slow  # two ahead-of-time compilations (the step and the pass): 30-120 s on 2 cores
@needs_compiler
def test_gptlab_compile_keeps_the_pass_and_sample_runs_it(tmp_path, large, capsys):
    """``gptlab compile`` keeps the prompt pass beside the step; ``gptlab sample`` of a long prompt then
    plans it, runs it (its report says so) and writes the text ``--compile off`` writes (float32)."""
    from gptlab.cli import main
    from gptlab.tokenizers import CharTokenizer

    text = "abcdefgh ij\n"
    tok = CharTokenizer.from_text(text)
    ckpt = gptlab.save(_model(vocab_size=tok.vocab_size), tok, tmp_path / "ckpt")
    store = tmp_path / "compiled"
    assert main(["compile", str(ckpt), "--compile-cache", str(store), "--dtype", "fp32"]) == 0
    assert "compiled the prompt pass of" in capsys.readouterr().err
    assert main(["compile", str(ckpt), "--compile-cache", str(store), "--dtype", "fp32"]) == 0
    again = capsys.readouterr().err  # a second time: nothing compiles, and it says so for both
    assert "one-row step of" in again and "prompt pass of" in again and again.count("kept already") == 2
    prompt = (text * 20)[:200]
    args = ["sample", str(ckpt), "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0"]
    args += ["--compile-cache", str(store), "--dtype", "fp32", "--verbose"]
    assert main([*args, "--compile", "off"]) == 0
    eager = capsys.readouterr().out
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "prompts of 128+ tokens through the kept compiled pass" in err
    assert f"prompt pass ran: compiled 1 (loaded from {store})" in err
    assert out == eager
