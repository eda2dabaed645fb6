"""What the compiled one-row step's tests share (generate, and the int4 layers' in model): a tiny model
whose step compiles from the first token, and greedy logits through that step or layer by layer."""

from __future__ import annotations

import torch

import gptlab
from gptlab.generate import BatchSession, prepare_decoding, prepared_of
from gptlab.model import GPT
from tests._tiny import tiny_model


def fused_model(fmt: str, **options) -> GPT:
    """The tiny model in weight format ``fmt``, its one-row step compiled from the first step."""
    model = gptlab.quantize(tiny_model(vocab_size=97, block_size=24, n_embd=64, **options), fmt)
    prepare_decoding(model, compile="on", compile_wait=True)  # compiled from the first step
    return model


def greedy_logits(model: GPT, prompt: list[int], steps: int, fused: bool, monkeypatch) -> list[torch.Tensor]:
    """Logits of ``steps`` greedy steps after ``prompt``, through the compiled one-row step or layer by layer."""
    engine = prepared_of(model)
    session = BatchSession(model, 1, one_token=engine.one_token if fused else None)
    assert (session.one_token is not None) == fused
    slot, logits = session.add(prompt)
    out = [logits]
    before = engine.one_token.compiled_calls
    for _ in range(steps):
        logits = session.step({slot: int(logits.argmax())})[slot]
        out.append(logits)
    # every step ran the compiled graph, not its eager fallback (and none did without it)
    assert engine.one_token.compiled_calls - before == (steps if fused else 0)
    return out
