"""The compiled one-row step is paid for once and never waited for (``gptlab.generate.one_token``).

Properties, not timings: a later process loads the stored step instead of compiling it (its public
counters and the engine's report say so); a damaged or foreign artefact is not loaded (a warning,
then it is compiled again); greedy tokens are the same eager, compiled, loaded, and when decoding
switches from the eager step to the compiled one mid-generation, and the report gives the split.
"""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import gptlab
from gptlab.compiling import Compiled, can_compile
from gptlab.generate import generate_ids, prepare_decoding, prepared_of
from gptlab.generate.one_token import PACKAGE, RECORD, StoredStep, decode_one_token, frozen_int8
from gptlab.model.kvcache import default_cache_dtype
from gptlab.model.quantized import Int8Linear, PackedBF16Linear, onednn_bf16
from tests._kept import keep_a_recording_step, store_a_fake
from tests._tiny import tiny_model

ROOT = Path(__file__).resolve().parents[2]
needs_compiler = pytest.mark.skipif(not can_compile("cpu"), reason="no C++ compiler for torch.compile")
PROMPT = [[3, 1, 4, 1, 5]]
NEW = 24


def _model() -> torch.nn.Module:
    return tiny_model(vocab_size=61, n_layer=2, n_head=4, n_embd=32, pos="rope", norm="rmsnorm")


def _greedy(model) -> list[int]:
    return generate_ids(model, torch.tensor(PROMPT), NEW, temperature=0)[0].tolist()


def _eager(model) -> list[int]:
    prepare_decoding(model, compile="off")
    return _greedy(model)


def _args(model) -> tuple:
    """The arguments of a first decode call (what ``StoredStep.load`` keys on)."""
    keys = [torch.zeros(1, 4, 16, 8) for _ in range(2)]
    return (model, torch.tensor([[1]]), torch.tensor([0]), keys, [k.clone() for k in keys], 1)


def _gated_build(release_after: int, built: list[str]):
    """A stand-in for the ahead-of-time compilation: its job finishes once the step has run eagerly
    ``release_after`` times and gives the eager step itself as "compiled" (the switch is under test)."""

    def build(self: StoredStep, args: tuple):
        step = prepared_of(args[0]).one_token
        done = threading.Event()

        def job():
            while step.eager_calls < release_after and not done.wait(0.005):
                pass
            built.append("built")
            return decode_one_token

        return job

    return build


def test_decoding_goes_on_eagerly_while_the_step_compiles_then_switches(monkeypatch, tmp_path):
    """The background switch: the same greedy tokens as all-eager, and the report gives the split."""
    model = _model()
    eager = _eager(model)
    built: list[str] = []
    monkeypatch.setattr(StoredStep, "build", _gated_build(5, built))
    monkeypatch.setattr("gptlab.compiling.can_compile", lambda device_type: True)
    engine = prepare_decoding(model, compile="on", compile_cache=tmp_path, compile_wait=False)
    assert engine.plan(1).step == "fused" and "eager until it is ready" in str(engine.plan(1))
    assert _greedy(model) == eager
    step = engine.one_token
    assert built == ["built"]
    assert step.eager_calls >= 5 and step.compiled_calls > 0
    assert (
        step.eager_calls + step.compiled_calls == NEW - 1
    )  # every decode step ran once, one way or the other
    report = engine.ran()
    assert report.startswith(
        f"one-row step ran: eager {step.eager_calls} tokens, then compiled {step.compiled_calls}"
    )


def test_waiting_for_the_step_runs_it_compiled_from_the_first_token(monkeypatch, tmp_path):
    model = _model()
    eager = _eager(model)
    monkeypatch.setattr(StoredStep, "build", _gated_build(0, []))
    monkeypatch.setattr("gptlab.compiling.can_compile", lambda device_type: True)
    engine = prepare_decoding(model, compile="on", compile_cache=tmp_path, compile_wait=True)
    assert _greedy(model) == eager
    assert (engine.one_token.eager_calls, engine.one_token.compiled_calls) == (0, NEW - 1)
    assert "the first step waits for it" in str(engine.plan(1))


@pytest.mark.parametrize(
    ("change", "damage", "said"),
    [
        ({"cpu": "ANOTHER"}, False, "its key is not"),  # another CPU kind's step, in this key's folder
        ({"torch": "0.0.1"}, False, "its key is not"),
        (None, True, "its sha256 differs"),  # the package changed after it was recorded
    ],
)
def test_a_damaged_or_foreign_step_is_not_loaded_and_is_compiled_again(
    tmp_path, monkeypatch, change, damage, said
):
    model = _model()
    store = StoredStep(tmp_path)
    store_a_fake(store, model, key_change=change, damage=damage)
    with pytest.warns(UserWarning, match=f"is not used \\({said}.*compiling it again"):
        assert store.load(_args(model)) is None
    # through the step: it warns, then builds (the stand-in compilation), and decodes the same tokens
    eager = _eager(model)
    built: list[str] = []
    monkeypatch.setattr(StoredStep, "build", _gated_build(0, built))
    monkeypatch.setattr("gptlab.compiling.can_compile", lambda device_type: True)
    engine = prepare_decoding(model, compile="on", compile_cache=tmp_path, compile_wait=True)
    with pytest.warns(UserWarning, match="compiling it again"):
        assert _greedy(model) == eager
    assert built == ["built"] and engine.one_token.source == "compiled"


def test_the_key_follows_what_the_compiled_code_depends_on():
    store = StoredStep(Path("unused"))
    fp32, int8 = _model(), gptlab.quantize(_model(), "int8")
    base = store.key(fp32, torch.float32)
    assert base["cpu"] == torch.backends.cpu.get_cpu_capability() and base["torch"] == torch.__version__
    assert store.key(_model(), torch.float32) == base  # the same model and machine: the same key
    assert store.key(int8, torch.float32)["modules"] != base["modules"]  # the weight format
    assert store.key(fp32, torch.bfloat16) != base  # the cache's dtype
    wider = tiny_model(vocab_size=61, n_layer=2, n_head=4, n_embd=64, pos="rope", norm="rmsnorm")
    assert store.key(wider, torch.float32)["config"] != base["config"]
    assert store.folder(base) != store.folder(store.key(int8, torch.float32))


SECOND_PROCESS = """
import json, sys, torch
import gptlab
from gptlab.generate import generate_ids, prepare_decoding
model, _ = gptlab.load(sys.argv[1], **json.loads(sys.argv[3]))
engine = prepare_decoding(model, compile="on", compile_cache=sys.argv[2])
out = generate_ids(model, torch.tensor({prompt}), {new}, temperature=0)[0].tolist()
step = engine.one_token
print(json.dumps(dict(tokens=out, source=step.source, compiled=step.compiled_calls, eager=step.eager_calls,
                      report=engine.ran())))
"""


@pytest.mark.slow  # an ahead-of-time compilation of the tiny step: 50-100 s on 2 busy cores
@needs_compiler
@pytest.mark.parametrize("weights", ["float32", "bf16", "int8", "int4", "int4-table"])
def test_a_second_process_loads_the_stored_step_instead_of_compiling(tmp_path, weights):
    """Float, bf16, int8 and int4 weights (the int4 kernel's group size is a tensor the package must not
    own), and a GGUF file's 4-bit token table kept int4 (a tied head sharing its bytes, rows gathered
    from them). Where bf16 is native the int8 matrices (and int4's int8 head) are frozen: the package
    holds none of their blocks, the record says how to make each from the model's own tensors; and bf16
    layers hold oneDNN's prepacked copies, which the step does not read (nor export)."""
    if weights == "int4-table":
        from gguf import GGMLQuantizationType

        from gptlab.interop.gguf_kept import from_gguf_kept
        from gptlab.model.int4 import Int4Embedding
        from tests.interop._gguf import tiny_llama, write_llama

        write_llama(tmp_path / "t.gguf", tiny_llama(vocab_size=304), GGMLQuantizationType.Q4_0)
        tiny = from_gguf_kept(tmp_path / "t.gguf")
        assert isinstance(tiny.wte, Int4Embedding)
    else:
        tiny = _model() if weights in ("float32", "bf16") else gptlab.quantize(_model(), weights)
    ckpt = gptlab.save(tiny, None, tmp_path / "ckpt")
    load = {"quantize": "bf16"} if weights == "bf16" else {}  # (a bf16 model is made at load)
    model, _ = gptlab.load(ckpt, **load)
    if weights == "bf16" and onednn_bf16():
        assert any(m.packed is not None for m in model.modules() if isinstance(m, PackedBF16Linear))
    eager = _eager(model)
    engine = prepare_decoding(model, compile="on", compile_cache=tmp_path / "store", compile_wait=True)
    compiled = _greedy(model)
    assert engine.one_token.source == "compiled" and engine.one_token.compiled_calls == NEW - 1
    assert "kept in" in engine.ran() and "not stored" not in engine.ran(), engine.ran()
    (folder,) = (tmp_path / "store").iterdir()
    record = json.loads((folder / RECORD).read_text())
    import hashlib

    assert record["sha256"] == hashlib.sha256((folder / PACKAGE).read_bytes()).hexdigest()
    if frozen_int8(model):  # every int8 matrix multiplied as blocks made from its own tensor (tied: any name)
        made_from = {id(operator.attrgetter(fqn[2:])(model)) for fqn, _ in record["derived"].values()}
        assert made_from == {id(m.weight) for m in model.modules() if isinstance(m, Int8Linear)}
    else:
        assert record["derived"] == {}
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS=str(torch.get_num_threads()))
    script = SECOND_PROCESS.format(prompt=PROMPT, new=NEW)
    run = subprocess.run(
        [sys.executable, "-c", script, str(ckpt), str(tmp_path / "store"), json.dumps(load)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    second = json.loads(run.stdout.strip().splitlines()[-1])
    # loaded at its first call: no eager token, nothing compiled, every step through the package
    assert (second["source"], second["eager"], second["compiled"]) == ("loaded", 0, NEW - 1), second
    assert "loaded from" in second["report"]
    assert eager == compiled == second["tokens"]  # greedy: eager, compiled, loaded from the store
    if frozen_int8(model):  # a weight written in place after the step was loaded: its blocks follow it
        _follows_a_weight_written_in_place(model, engine.one_token)


def _follows_a_weight_written_in_place(model, step: Compiled) -> None:
    """The loaded step's logits are the eager step's after the head's first 30 rows are zeroed in place:
    those logits become 0, where stale blocks would still give the old ones."""
    dtype = default_cache_dtype(model.dtype, model.device)

    def logits(run) -> torch.Tensor:  # after token 60 (a row left as it was)
        keys = [torch.zeros(1, 4, 16, 8, dtype=dtype) for _ in range(2)]
        with torch.inference_mode():
            return run(model, torch.tensor([[60]]), torch.tensor([0]), keys, [k.clone() for k in keys], 1)

    before = logits(step)
    with torch.no_grad():
        model.lm_head.weight[:30].zero_()
    after, eager = logits(step), logits(decode_one_token)
    torch.testing.assert_close(after, eager, rtol=0.05, atol=0.05)
    assert after[:, :30].abs().max() == 0 < before[:, :30].abs().max() - 0.1


def test_a_compiled_step_that_fails_in_the_background_falls_back_and_says_so(monkeypatch):
    def job_fails(args):
        def job():
            raise RuntimeError("inductor: no such header <Python.h>")

        return job

    monkeypatch.setattr("gptlab.compiling.can_compile", lambda device_type: True)
    step = Compiled(lambda x: x + 1, "a test step", build=job_fails, background=True)
    x = torch.arange(3.0)
    assert torch.equal(step(x), x + 1)  # eager, and the compilation starts
    step.wait()
    with pytest.raises(UserWarning, match="a test step: torch.compile failed .*Python.h"):
        step(x)  # pyproject turns the fallback's warning into an error in tests
    assert not step.enabled and step.compiled_calls == 0 and step.eager_calls == 1


def test_auto_plans_the_compiled_step_once_the_cache_holds_it(tmp_path, monkeypatch):
    """``compile="auto"`` reads the compile cache: layer by layer while it lacks this model's step,
    the compiled step (loaded at its first call) once a package and its record are there."""
    monkeypatch.setattr("gptlab.generate.plan.STREAM_MIN_BYTES", 0)  # as if the model were large
    monkeypatch.setattr("gptlab.generate.plan.compile_blocker", lambda device: None)
    model = _model()
    engine = prepare_decoding(model, compile="auto", compile_cache=tmp_path)
    assert engine.plan(1).step == "layers" and not engine.step_kept()
    assert "the compile cache does not hold it yet" in engine.plan(1).why
    folder = store_a_fake(StoredStep(tmp_path), model)
    assert folder == engine.step_folder(torch.float32) == engine.step_folder()
    assert engine.step_kept() and engine.plan(1).step == "fused"
    assert f"loaded from {tmp_path}" in str(engine.plan(1))
    assert engine.plan(2).step == "layers"  # batches: the one-row step is not theirs
    assert engine.step_folder(torch.int8) is None  # an int8 cache has no one-row step
    (folder / PACKAGE).unlink()
    assert not engine.step_kept() and engine.plan(1).step == "layers"


def test_a_session_of_several_rows_runs_a_lone_row_through_the_kept_step(tmp_path, monkeypatch):
    """The server's session (several rows): a step that feeds one row goes through the one-row step
    once the compile cache keeps it, on that row's own cache rows; its logits are the layer-by-layer
    ones. Steps of several rows, and any step before the step is kept, run layer by layer."""
    monkeypatch.setattr("gptlab.generate.plan.STREAM_MIN_BYTES", 0)
    monkeypatch.setattr("gptlab.generate.plan.compile_blocker", lambda device: None)
    model = _model()
    engine = prepare_decoding(model, compile="auto", compile_cache=tmp_path)
    # the rows end together: a shorter prompt starts later in its row, which the one-row step (its
    # attention reads from position 0) does not take, so slot 2, which starts at 0, is the lone one
    prompts = [[3, 1, 4, 1], [2, 7, 1], [6, 6, 2, 9, 5]]

    def run(session) -> list[torch.Tensor]:
        out = [logits for _, logits in session.add_many(prompts)]
        out += session.step({0: 1, 1: 2, 2: 3}).values()
        session.remove(0)
        session.remove(1)
        for t in (4, 5, 6):  # slot 2 alone
            out.append(session.step({2: t})[2])
        return out

    assert not engine.plan(3).lone_rows
    session = engine.dynamic_session(engine.plan(3), 3)
    assert session.one_token is None  # not kept: layer by layer
    run(session)
    calls = keep_a_recording_step(model, tmp_path)
    assert engine.plan(3).lone_rows and "(a lone row: one compiled graph per token" in str(engine.plan(3))
    fused = run(engine.dynamic_session(engine.plan(3), 3))
    assert calls == [1, 1, 1]  # the three lone steps, each on one row
    prepare_decoding(model, compile="off")
    layers = run(prepared_of(model).dynamic_session(prepared_of(model).plan(3), 3))
    for a, b in zip(fused, layers, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_later_generation_takes_up_a_step_kept_since(tmp_path, monkeypatch):
    """A process that began layer by layer (a chat: each answer is planned afresh) decodes its next
    generation through the one-row step once the compile cache keeps it (a background ``gptlab
    compile`` finished meanwhile): every token after the first, the same greedy tokens."""
    monkeypatch.setattr("gptlab.generate.plan.STREAM_MIN_BYTES", 0)
    monkeypatch.setattr("gptlab.generate.plan.compile_blocker", lambda device: None)
    model = _model()
    engine = prepare_decoding(model, compile="auto", compile_cache=tmp_path)
    assert engine.plan(1).step == "layers"
    before = _greedy(model)
    calls = keep_a_recording_step(model, tmp_path)
    assert engine.plan(1).step == "fused"
    assert _greedy(model) == before == _eager(_model())
    assert calls == [1] * (NEW - 1)  # each step after the prefill, one row
