"""Shared by the ``to_hf`` tests (``tests/interop/test_export_hf*.py``): tiny models and the comparisons."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from gptlab import GPT, GPTConfig
from tests._tiny import tiny_model

TOL = 1e-5  # float32 logits: transformers' against gptlab's
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 4
SHAPE = dict(vocab_size=61, block_size=32, n_layer=2, n_head=4, n_embd=32)

#: decoder option families that no transformers class computes (exported as remote code)
DECODERS = {
    "char-best": dict(pos="rope", norm="rmsnorm", mlp="relu2", bias=False, qk_norm=True),
    "learned-post-layernorm-gelu-untied": dict(
        pos="learned", norm_placement="post", mlp="gelu", tie_embeddings=False
    ),
    "sinusoidal-rmsnorm-geglu": dict(pos="sinusoidal", norm="rmsnorm", mlp="geglu", bias=False),
    "alibi-reglu-gqa": dict(pos="alibi", mlp="reglu", n_kv_head=2),
    "none-dual_glu-tanh-mqa": dict(pos="none", mlp="dual_glu", glu_act="tanh", n_kv_head=1),
    "rope-relu-softcap-bias": dict(pos="rope", mlp="relu", logit_softcap=5.0),
    "learned-gelu_tanh-no-bias": dict(pos="learned", mlp="gelu_tanh", bias=False),
    "rope-swiglu-qk_norm-bias-gqa": dict(pos="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True, n_kv_head=2),
    "moe-top1": dict(pos="rope", mlp="swiglu", n_experts=2, experts_top_k=1),
    "padded-vocab": dict(pos="rope", mlp="relu2", vocab_multiple=64),  # the file holds the 61 real rows
}


def hf_dir(tmp_path: Path, name: str = "hf") -> Path:
    """An export folder named after the pytest-xdist worker: transformers copies a local folder's code
    into ``transformers_modules/<folder name>/<hash of the code>/``, so two workers must not share a
    folder name (one could import a file the other is still writing), while one worker's tests reuse
    one copy (the cache does not grow run after run)."""
    return tmp_path / f"{name}_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def perturbed(config: GPTConfig, seed: int = 0) -> GPT:
    """``config``'s model in float32 eval mode, every parameter moved off its initial value."""
    return tiny_model(seed=seed, jitter=0.2, **config.to_dict())


def load_hf(transformers, directory: Path, auto: str = "AutoModelForCausalLM", **kw):
    """``transformers.<auto>.from_pretrained(directory)`` with remote code, in float32, eval mode."""
    cls = getattr(transformers, auto)
    return cls.from_pretrained(str(directory), trust_remote_code=True, dtype=torch.float32, **kw).eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a.float() - b.float()).abs().max().item()
