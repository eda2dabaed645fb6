"""The printed plan is what runs: every combination the plan can choose on a CPU, driven through the
public loop, and what ran (the session, its step, the sampler, the drafts) checked against the plan
that was printed for it.

The plan is captured as the driver asked for it (``PreparedDecoding.plan`` wrapped), the session as
the driver built it; the sessions carry the plan out and decide nothing themselves, so a session or
step that re-decided (a fused step refused, a static step frozen where the plan said eager) fails
here. CUDA graphs need a GPU (``tests/generate/test_static_cache.py`` covers them there).
"""

from __future__ import annotations

import pytest
import torch

from gptlab.compiling import can_compile
from gptlab.generate import SampleConfig, driver, prepare_decoding, prepared_of
from gptlab.generate.plan import STEPS
from gptlab.generate.prepared import PreparedDecoding
from gptlab.generate.session import BatchSession
from gptlab.generate.static import StaticSession
from tests._tiny import tiny_model

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8], [1, 6, 1, 8, 0, 3, 3, 9]]
REQUESTS = {
    "greedy": ({"temperature": 0.0}, None),
    "sampled": ({"temperature": 0.9, "top_k": 7, "seed": 3}, None),
    "penalties": ({"temperature": 0.8, "repetition_penalty": 1.3, "seed": 3}, None),
    "probabilities": ({"temperature": 0.0}, 3),  # top_n: the dynamic cache
    "lookup": ({"temperature": 0.0, "prompt_lookup": "on"}, None),
    "beam": ({"beam_width": 2}, None),
}


def _ran(model: torch.nn.Module, batch: int, options: dict, top_n: int | None, monkeypatch) -> tuple:
    """Decode ``batch`` prompts with ``options`` through the driver → (the plan it asked for, the session,
    the rows, compiled calls during the run)."""
    plans = []
    original = PreparedDecoding.plan

    def recorded(self, *args, **kwargs):
        plans.append(original(self, *args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(PreparedDecoding, "plan", recorded)
    before = sum(step.compiled_calls for step in prepared_of(model).compiled_steps)
    config = SampleConfig(max_new_tokens=6, **options)
    session, rows = driver.start(model, None, PROMPTS[:batch], config, None, top_n=top_n)
    events = list(driver.decode_rows(session, rows))
    assert sum(e.finish_reason is not None for e in events) == batch  # every row ran to its end
    after = sum(step.compiled_calls for step in prepared_of(model).compiled_steps)
    monkeypatch.setattr(PreparedDecoding, "plan", original)
    assert len(plans) == 1  # the driver asked once and ran that
    return plans[0], session, rows, after - before


def _check(plan, session, rows, compiled_calls) -> None:
    line = str(plan)
    assert STEPS[plan.step] in line and f"{plan.session} cache" in line and f"{plan.sampler} sampler" in line
    static = isinstance(session, StaticSession)
    assert static == (plan.session == "static"), line
    assert (plan.sampler == "in-graph") == static, line
    if static:
        assert (session.frozen is not None) == (plan.step == "frozen"), line
        assert (plan.step == "eager") == (not session.compiled and session.frozen is None), line
    else:
        assert isinstance(session, BatchSession)
        assert (session.one_token is not None) == (plan.step == "fused" or plan.lone_rows), line
    said_compiled = plan.step not in ("layers", "eager")
    assert said_compiled == (compiled_calls > 0), line
    drafted = [r.drafter is not None for r in rows]
    assert drafted == [plan.draft == "prompt-lookup"] * len(rows), line


@pytest.mark.parametrize("request_kind", sorted(set(REQUESTS) - {"beam"}))
@pytest.mark.parametrize("static", [None, False, True], ids=["static-auto", "static-off", "static-on"])
@pytest.mark.parametrize("batch", [1, 3])
def test_what_runs_is_the_printed_plan(batch, static, request_kind, monkeypatch):
    model = tiny_model(n_layer=1, n_head=2, pos="rope")
    prepare_decoding(model, compile="off", static=static)
    options, top_n = REQUESTS[request_kind]
    plan, session, rows, calls = _ran(model, batch, options, top_n, monkeypatch)
    _check(plan, session, rows, calls)
    if static and request_kind in ("greedy", "sampled", "penalties"):
        assert plan.session == "static"  # the combinations are reached, not only allowed
    if request_kind == "probabilities" or static is False:
        assert plan.session == "dynamic"
    if request_kind == "lookup" and batch == 1 and not static:
        assert plan.draft == "prompt-lookup"


def test_beam_search_and_encoder_decoders_are_routes_the_plan_decides_and_prints(monkeypatch):
    """Beam search and an encoder–decoder's sources are the plan's routes: printed, and what the public
    entry points then run (beam search never reaches the batched driver; a bound source is planned
    like a GPT)."""
    from gptlab.generate import generate_ids

    model = tiny_model(n_layer=1, n_head=2, pos="rope")
    engine = prepare_decoding(model, compile="off", static=True)
    plan = engine.plan(1, config=SampleConfig(beam_width=2))
    assert (plan.session, plan.step, plan.sampler, plan.route) == ("dynamic", "layers", "per-request", "beam")
    assert "beam search" in str(plan)
    assert engine.plan(1, config=SampleConfig()).route == "rows"
    started = []
    monkeypatch.setattr(driver, "start", lambda *a, **k: started.append(a) or pytest.fail("batched driver"))
    generate_ids(model, torch.tensor([PROMPTS[0]]), 4, beam_width=2)  # the beam route only
    assert started == []

    encdec = tiny_model(n_layer=1, n_head=2, arch="encoder-decoder")
    plan = prepared_of(encdec).plan(1, config=SampleConfig())
    assert plan.route == "source" and "each source bound alone" in str(plan)
    assert prepared_of(encdec.bind(torch.tensor([PROMPTS[0]]))).plan(1).route == "rows"  # bound: a GPT


needs_compiler = pytest.mark.skipif(not can_compile("cpu"), reason="torch.compile has no C++ compiler here")


@pytest.mark.slow  # compiles the one-row step and the frozen batch step (minutes on 2 cores)
@needs_compiler
@pytest.mark.parametrize("batch", [1, 3])
def test_compiled_steps_run_as_printed(batch, monkeypatch):
    model = tiny_model(n_layer=1, n_head=2, pos="rope")
    prepare_decoding(model, compile="on", static=None if batch == 1 else True, compile_wait=True)
    plan, session, rows, calls = _ran(model, batch, {"temperature": 0.0}, None, monkeypatch)
    assert plan.step == ("fused" if batch == 1 else "frozen"), plan
    _check(plan, session, rows, calls)
