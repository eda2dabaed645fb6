"""Fixtures of the evaluation tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.evaluate._lmeval import BLOCK, EOT, EVALS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random GPT whose character alphabet covers every task's text (``evals/data``)."""
    import torch

    import gptlab
    from gptlab import GPT, GPTConfig
    from gptlab.tokenizers import CharTokenizer

    text = "".join(p.read_text(encoding="utf-8") for p in (EVALS / "data").glob("*.jsonl"))
    tok = CharTokenizer.from_text(text + "".join(map(chr, range(32, 127))) + "\n", special_tokens=[EOT])
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, block_size=BLOCK, n_layer=2, n_head=4, n_embd=32, pos="rope")
    )
    return gptlab.save(model, tok, tmp_path_factory.mktemp("lmeval") / "tiny")
