"""Instruction fine-tuning end to end: a behaviour the base model lacks, learnt with the assistant-only loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_masked_instruction_finetune_reaches_90_percent_exact_match(tmp_path):
    bench = load_bench("finetune_chat")
    records, held = bench.make_task()
    prompts = {r["messages"][0]["content"] for r in records}
    assert not prompts & {p for p, _ in held}  # held-out word pairs are never trained on
    result = bench.run_task(tmp_path, masked=True, steps=200)
    assert result["base_exact_match"] == 0.0  # the base model does not have the answer format
    assert result["masked_exact_match"] >= 0.9
