"""Instruction fine-tuning end to end: a behaviour the base model lacks, learnt with the assistant-only loss."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_masked_instruction_finetune_reaches_90_percent_exact_match(tmp_path):
    from bench import finetune_chat

    records, held = finetune_chat.make_task()
    prompts = {r["messages"][0]["content"] for r in records}
    assert not prompts & {p for p, _ in held}  # held-out word pairs are never trained on
    result = finetune_chat.run_task(tmp_path, masked=True, steps=200)
    assert result["base_exact_match"] == 0.0  # the base model does not have the answer format
    assert result["masked_exact_match"] >= 0.9
