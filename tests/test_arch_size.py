"""``gptlab size``'s parameter formulas cover the gated FFN family, encoders and encoder–decoders."""

from __future__ import annotations

import itertools

import pytest

from gptlab.inspect import size_report
from gptlab.model import GPTConfig, build_model

GRID = list(
    itertools.product(
        ("swiglu", "geglu", "reglu", "dual_glu", "gelu"),
        ("decoder", "encoder", "encoder-decoder"),
        ("learned", "rope"),
    )
)


@pytest.mark.parametrize(("mlp", "arch", "pos"), GRID)
def test_size_formulas_match_the_model(mlp: str, arch: str, pos: str) -> None:
    i = GRID.index((mlp, arch, pos))
    c = GPTConfig(
        vocab_size=37,
        block_size=16,
        n_layer=2,
        n_head=4,
        n_embd=32,
        mlp=mlp,
        arch=arch,
        pos=pos,
        n_kv_head=(4, 2, 1)[i % 3],
        bias=i % 2 == 0,
        tie_embeddings=i % 4 < 2,
        qk_norm=i % 5 == 0,
        norm_placement=("pre", "post")[i % 2],
        n_encoder_layer=3 if arch == "encoder-decoder" and i % 2 else None,
    )
    report = size_report(c)
    counts = build_model(c).num_params()
    for part in ("embeddings", "positions", "attention", "feed_forward", "norms", "head", "total"):
        assert report.value(part) == counts[part], part
