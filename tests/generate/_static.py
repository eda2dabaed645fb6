"""What the static-cache tests share (generate, and the server's static lanes): the tiny model they
decode, their prompts, the dynamic reference (one prompt alone) and a lock-step run of a ``StaticSession``."""

from __future__ import annotations

import torch

from gptlab.generate import SampleConfig, generate_ids
from gptlab.generate.prepared import prepare_decoding
from gptlab.generate.static import StaticSession
from gptlab.model import GPT
from tests._tiny import tiny_model

GREEDY = SampleConfig(temperature=0, max_new_tokens=64)
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15], [3], [40, 41, 42]]


def eager_static(model, **settings):
    """``model`` decoded through the static cache, its step run eagerly (what a CPU test can check)."""
    prepare_decoding(model, static=True, compile="off", **settings)
    return model


def tiny(block_size: int = 48, n_layer: int = 2, **options) -> GPT:
    return tiny_model(block_size=block_size, n_layer=n_layer, init_std=0.3, **options)


def alone(model: GPT, prompt: list[int], n: int, **sampling) -> list[int]:
    """The dynamic reference: one prompt, ``n`` new tokens."""
    out = generate_ids(model, torch.tensor([prompt]), n, **{"temperature": 0, **sampling})
    return out[0, len(prompt) :].tolist()


def run(session: StaticSession, prompts, n: int, configs=None, seeds=None) -> dict[int, list[int]]:
    """Prefill ``prompts`` together, then ``n − 1`` lock-step decode steps → tokens per slot."""
    configs = configs or [GREEDY] * len(prompts)
    seeds = seeds or [0] * len(prompts)
    got = {slot: [tok] for slot, tok in session.add_many(prompts, configs, seeds)}
    for _ in range(n - 1):
        for slot, tok in session.step(list(got)).items():
            got[slot].append(tok)
    return got
