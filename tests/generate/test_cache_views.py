"""The compiled steps build their ``KVView``s inside the graph: one trace serves every length and bucket."""

from __future__ import annotations

import pytest
import torch

from gptlab.compiling import Compiled
from gptlab.generate import StaticSession
from gptlab.generate.one_token import decode_one_token
from gptlab.generate.static import decode_bucket
from tests._tiny import tiny_model


@pytest.fixture
def no_recompiles():
    """Any recompilation is an error (a guard on a length, a bucket or a view attribute)."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


def test_the_one_row_step_traces_once_for_every_cache_length(no_recompiles):
    model = tiny_model(pos="rope", n_kv_head=2, block_size=24)
    cfg = model.config
    keys = [torch.zeros(1, 2, 24, cfg.head_dim) for _ in range(cfg.n_layer)]
    values = [torch.zeros_like(k) for k in keys]
    step = torch.compile(decode_one_token, backend="eager", dynamic=True, fullgraph=True)
    with torch.inference_mode():
        for end in range(2, 9):
            got = step(model, torch.tensor([[end]]), torch.tensor([end - 1]), keys, values, end)
            want = decode_one_token(model, torch.tensor([[end]]), torch.tensor([end - 1]), keys, values, end)
            torch.testing.assert_close(got, want)


def test_the_static_step_traces_once_for_every_bucket_and_horizon(no_recompiles):
    model = tiny_model(pos="rope", n_kv_head=2, block_size=24)
    session = StaticSession(model, 4, 24, step="eager")
    # as StaticSession compiles it on a CPU (each size its own symbol), traced only
    step = Compiled(decode_bucket, "static step", True, distinct_sizes=True, backend="eager", fullgraph=True)
    with torch.inference_mode():
        for b, h in ((2, 8), (3, 16), (4, 24)):
            step(session, torch.empty(b), "greedy", torch.zeros(h))
    assert step.compiled_calls == 3


def test_the_one_row_step_follows_the_cache_as_it_grows():
    """``BatchSession`` hands the one-row step each layer's row as views made once per slot; when the
    cache grows (new tensors) the step must be given the new ones, or it writes where nothing reads."""
    from gptlab.generate.session import BatchSession

    model = tiny_model(pos="rope", n_kv_head=2, block_size=64)
    prompt, feed = [3, 1, 4], [1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    runs = []
    for one_token in (decode_one_token, None):
        session = BatchSession(model, 1, capacity=2, one_token=one_token)  # grows 2 → 4 → 8 → 16
        slot, logits = session.add(prompt)
        steps = [logits]
        for token in feed:
            steps.append(session.step({slot: token})[slot])
        runs.append(steps)
        assert session.capacity == 16
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
