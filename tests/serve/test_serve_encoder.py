"""Serving a masked-language encoder: the Inside view and fill-mask work, the generating routes say why not.

``gptlab serve`` of a bidirectional encoder answers ``/v1/models``, ``/health`` and the limits
(``task: fill-mask``), the Inside view with its full (unmasked) matrices and the lens and
distribution at the first ``[MASK]``, and ``POST /v1/gptlab/fill`` (equal to ``gptlab fill``);
completions, chat and generate answer a 400 in OpenAI's shape, and are not in its schema.
"""

from __future__ import annotations

import base64
import re

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from gptlab import GPTConfig
from gptlab.inspect import attention_maps
from gptlab.inspect.fill import MASK, fill_masks
from gptlab.model import build_model
from gptlab.serve import create_app
from gptlab.serve.tasks import GENERATING
from gptlab.tokenizers import CharTokenizer
from gptlab.train.objectives import with_mask_token

ALPHABET = "abcdefghijklmnopqrstuvwxyz .:"
TEXT = f"the c{MASK}t sat on the mat"


def tiny(arch: str, tok: CharTokenizer):
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=tok.vocab_size, block_size=48, n_layer=2, n_head=2, n_embd=32, init_std=0.2, arch=arch
    )
    return build_model(config).eval().float()


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return with_mask_token(CharTokenizer.from_text(ALPHABET))


@pytest.fixture(scope="module")
def encoder(tok: CharTokenizer):
    return tiny("encoder", tok)


@pytest.fixture(scope="module")
def client(encoder, tok: CharTokenizer):
    with TestClient(create_app(encoder, tok, model_name="mlm", max_batch=2)) as c:
        yield c


def floats(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype="<f4")


def weights(layer: dict) -> np.ndarray:
    q = np.frombuffer(base64.b64decode(layer["data"]), dtype="<u2").astype(np.float64)
    return (q / layer["scale"]).reshape(layer["shape"])


def test_models_health_and_limits_answer_and_say_the_task(client) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == "mlm"
    assert client.get("/health").json()["status"] == "ok"
    limits = client.get("/v1/gptlab/limits").json()
    assert (limits["task"], limits["mask_token"]) == ("fill-mask", MASK)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "the cat"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi: there"}]}),
        ("/v1/gptlab/generate", {"prompt": "the cat", "max_tokens": 4}),
        ("/v1/completions", {"prompt": 3}),  # a bad body is refused the same way: nothing is read
    ],
)
def test_generating_routes_answer_a_400_that_says_the_model_fills_masks(client, path, body) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "model_cannot_generate"
    assert "fills masks and does not generate" in error["message"] and "/v1/gptlab/fill" in error["message"]


def test_the_schema_has_fill_and_not_the_generating_routes(client, tok) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert "/v1/gptlab/fill" in paths and "/v1/gptlab/inside" in paths
    assert not set(GENERATING) & set(paths)
    pattern = spec["components"]["schemas"]["FillRequest"]["properties"]["text"]["pattern"]
    assert re.fullmatch(pattern, TEXT) and not re.fullmatch(pattern, "the [MASK") and "MASK" not in ALPHABET
    decoder = tiny("decoder", tok)
    with TestClient(create_app(decoder, tok, model_name="gpt")) as c:
        paths = c.get("/openapi.json").json()["paths"]
        assert set(GENERATING) <= set(paths) and "/v1/gptlab/fill" not in paths
        assert c.post("/v1/gptlab/fill", json={"text": TEXT}).status_code == 404
        assert c.get("/v1/gptlab/limits").json()["task"] == "generate"


def test_fill_equals_gptlab_fill(client, encoder, tok) -> None:
    text = f"{MASK}he cat s{MASK}t"
    body = client.post("/v1/gptlab/fill", json={"text": text, "top": 3}).json()
    predictions, filled = fill_masks(encoder, tok, text, top_k=3)
    assert [m["position"] for m in body["masks"]] == [p.position for p in predictions] == [0, 9]
    for got, want in zip(body["masks"], predictions):
        assert [t["token"] for t in got["top"]] == [t for t, _ in want.top]
        assert [t["prob"] for t in got["top"]] == pytest.approx([q for _, q in want.top], abs=1e-6)
    assert body["text"] == filled and MASK not in filled
    none = client.post("/v1/gptlab/fill", json={"text": "the cat"}).json()
    assert none["masks"] == [] and none["text"] == "the cat"


def test_inside_reads_the_first_mask_and_shows_the_full_matrix(client, encoder, tok) -> None:
    ids = tok.encode(TEXT, allowed_special="all")
    mask_at = ids.index(tok.special_tokens[MASK])
    body = client.post("/v1/gptlab/inside", json={"text": TEXT, "layer": 1, "top": 4}).json()
    assert body["position"] == mask_at == 5 and body["causal"] is False
    assert body["attention"]["self"]["title"] == "bidirectional self-attention"
    with torch.no_grad():
        out = encoder.run(torch.tensor([ids]), output_hidden_states=True)
    np.testing.assert_allclose(floats(body["next_logits"]["data"]), out.logits[0, mask_at].numpy(), atol=1e-5)
    for row, h in zip(body["lens"]["layers"], out.hidden_states):
        p = torch.softmax(encoder.lm_head(encoder.norm_f(h[0, mask_at])).detach(), dim=-1)
        assert [t["prob"] for t in row["top"]] == pytest.approx(p.topk(4).values.tolist(), abs=1e-5)
    shown, maps = weights(body["attention_layer"]), attention_maps(encoder, tok, ids)
    np.testing.assert_allclose(shown, maps[1].numpy(), atol=1e-4, rtol=0)
    assert shown[0, 0, 1:].sum() > 0.5  # above the diagonal: the first token sees the later ones
    last = client.post("/v1/gptlab/inside", json={"text": TEXT, "position": -1}).json()
    assert last["position"] == len(ids) - 1
    past = client.post("/v1/gptlab/inside", json={"text": TEXT, "position": 127}).json()
    assert past["position"] == len(ids) - 1  # past the end is the end
    assert client.post("/v1/gptlab/inside", json={"text": "the cat"}).json()["position"] == 6  # no mask


def test_a_decoders_lens_at_a_chosen_position(tok) -> None:
    decoder = tiny("decoder", tok)
    ids = tok.encode("the cat sat")
    with TestClient(create_app(decoder, tok, model_name="gpt")) as c:
        body = c.post("/v1/gptlab/inside", json={"text": "the cat sat", "position": 2, "top": 3}).json()
        assert body["position"] == 2 and body["distribution"]["position"] == 2
        assert c.post("/v1/gptlab/inside", json={"text": "the cat sat"}).json()["position"] == len(ids) - 1
    with torch.no_grad():
        out = decoder.run(torch.tensor([ids]), output_hidden_states=True)
    np.testing.assert_allclose(floats(body["next_logits"]["data"]), out.logits[0, 2].numpy(), atol=1e-5)
    top = [t["id"] for t in body["lens"]["layers"][-1]["top"]]
    assert top == out.logits[0, 2].topk(3).indices.tolist()


def test_fuzz_an_encoders_server(tok, tmp_path) -> None:
    """Schemathesis on a live encoder's server: every route in its schema (fill and Inside included)
    answers as documented, valid data is accepted, and nothing is a 5xx."""
    import gptlab
    from bench import serve_robustness as robustness
    from tests.serve._fuzz import KEY, fuzz

    ckpt = gptlab.save(tiny("encoder", tok), tok, tmp_path / "mlm")
    extra = ["--api-key", KEY, "--device", "cpu", "--dtype", "fp32", "--model-name", "mlm"]
    with robustness.serve_load.serve(str(ckpt), max_batch=2, extra=extra, timeout=120) as url:
        paths = httpx.get(f"{url}/openapi.json").json()["paths"]
        generated, out = fuzz(url, tmp_path, "--phases", "examples,fuzzing", "-n", "8", "--seed", "1")
    assert generated >= 40 and "No issues found" in out
    assert "/v1/gptlab/fill" in paths and f"Tested: {sum(map(len, paths.values()))}" in out
