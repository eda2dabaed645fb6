"""The Inside view's computation (gptlab.inspect.inside) and its routes, against direct computations."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from gptlab import GPT, GPTConfig
from gptlab.errors import GptlabError
from gptlab.inspect import attention_maps
from gptlab.inspect.attention import seq2seq_maps
from gptlab.inspect.inside import inside
from gptlab.inspect.recording import model_input, record
from gptlab.model import build_model
from gptlab.serve import create_app
from gptlab.serve.schemas import MAX_INSIDE_TOKENS
from gptlab.tokenizers import CharTokenizer
from tests import ROOT
from tests._tiny import tiny_model

ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:\n.,!?"
TEXT = "The cat sat on the mat."


def char_model(tok: CharTokenizer, **kw) -> GPT:
    return tiny_model(**{"vocab_size": tok.vocab_size, "block_size": 64, "n_layer": 4, "init_std": 0.2, **kw})


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(ALPHABET)


@pytest.fixture(scope="module")
def model(tok: CharTokenizer) -> GPT:
    return char_model(tok, pos="rope", norm="rmsnorm")


def test_stages_come_in_the_blueprints_order_with_their_shapes(model: GPT, tok: CharTokenizer) -> None:
    view = inside(model, tok, TEXT, top=5).overview
    T, d, V = len(TEXT), 32, tok.vocab_size
    stages = {s["name"]: s for s in view["stages"]}
    assert list(stages) == ["tokens", "embedding", "position", "blocks", "final", "logits", "distribution"]
    assert stages["tokens"]["shape"] == [T] and [t["token"] for t in view["tokens"]] == list(TEXT)
    assert stages["embedding"]["shape"] == [T, d] and stages["embedding"]["table_shape"] == [V, d]
    assert stages["logits"]["shape"] == [T, V] and stages["distribution"]["shape"] == [V]
    assert stages["position"]["kind"] == "rope" and "θ_i" in stages["position"]["equation"]
    assert stages["blocks"]["equation"].startswith("h' = h + MultiHead(LN(h))")
    assert all(s["guide"].startswith("docs/guide/inside.md#") for s in view["stages"])
    blocks = stages["blocks"]["layers"]
    assert len(blocks) == 4 and all(len(b[k]) == T for b in blocks for k in ("attention", "feed_forward"))
    assert len(view["lens"]["layers"]) == 5 and len(view["lens"]["layers"][0]["top"]) == 5
    assert set(view["attention"]) == {"self"} and view["attention"]["self"]["shape"] == [4, 4, T, T]


def test_sublayer_contributions_add_up_to_the_residual_stream(model: GPT, tok: CharTokenizer) -> None:
    """Pre-norm: h⁽ˡ⁾ = h⁽ˡ⁻¹⁾ + a⁽ˡ⁾ + f⁽ˡ⁾, with a and f the hooked sublayer outputs."""
    rec = record(model, model_input(model, tok, TEXT), sublayers=True)
    for layer in range(4):
        a, f = rec.sublayers["attention"][layer], rec.sublayers["feed_forward"][layer]
        torch.testing.assert_close(rec.hidden[layer] + a + f, rec.hidden[layer + 1], atol=1e-5, rtol=1e-5)
    view = inside(model, tok, TEXT).overview
    blocks = next(s for s in view["stages"] if s["name"] == "blocks")["layers"]
    assert blocks[2]["feed_forward"] == pytest.approx(
        rec.sublayers["feed_forward"][2].norm(dim=-1).tolist(), abs=1e-4
    )


def test_logit_lens_equals_a_direct_computation(model: GPT, tok: CharTokenizer) -> None:
    lens = inside(model, tok, TEXT, top=3).overview["lens"]["layers"]
    with torch.no_grad():
        out = model.run(torch.tensor([tok.encode(TEXT)]), output_hidden_states=True)
        for layer, h in enumerate(out.hidden_states):
            p = torch.softmax(model.lm_head(model.norm_f(h[0, -1])), dim=-1)
            want_p, want_i = p.topk(3)
            assert [x["id"] for x in lens[layer]["top"]] == want_i.tolist()
            assert [x["prob"] for x in lens[layer]["top"]] == pytest.approx(want_p.tolist(), abs=1e-5)
        final = torch.softmax(out.logits[0, -1], dim=-1)
    assert lens[-1]["final"]["rank"] == 0 and lens[-1]["final"]["prob"] == pytest.approx(float(final.max()))


def test_attention_equals_attention_maps_and_an_encoder_sees_both_ways(tok: CharTokenizer) -> None:
    model = char_model(tok, pos="learned")
    torch.testing.assert_close(inside(model, tok, TEXT).attentions["self"], attention_maps(model, tok, TEXT))
    encoder = char_model(tok, arch="encoder")
    view = inside(encoder, tok, TEXT)
    maps = view.attentions["self"]
    assert maps[:, :, 0, 1:].sum() > 0  # the first position attends to later ones
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    assert "masked" in next(s for s in view.overview["stages"] if s["name"] == "distribution")["predicts"]


def test_an_encoder_decoder_shows_self_cross_and_encoder_attention(tok: CharTokenizer) -> None:
    tok_eot = CharTokenizer.from_text(ALPHABET, special_tokens=["<|endoftext|>"])
    model = char_model(tok_eot, arch="encoder-decoder")
    view = inside(model, tok_eot, "abc", target="cb")
    shapes = {k: list(v.shape) for k, v in view.attentions.items()}
    assert shapes == {"self": [4, 4, 3, 3], "cross": [4, 4, 3, 3], "encoder": [4, 4, 3, 3]}
    blocks = next(s for s in view.overview["stages"] if s["name"] == "blocks")
    assert blocks["sublayers"] == ["attention", "cross_attention", "feed_forward"]
    assert "CrossAttn" in blocks["equation"] and view.overview["source_tokens"][0]["token"] == "a"


def test_bad_input_is_a_gptlab_error(model: GPT, tok: CharTokenizer) -> None:
    with pytest.raises(GptlabError, match="top"):
        inside(model, tok, TEXT, top=0)
    with pytest.raises(GptlabError, match="empty"):
        inside(model, tok, "")


# ------------------------------------------------------------------ the routes
def weights(layer: dict) -> np.ndarray:
    q = np.frombuffer(base64.b64decode(layer["data"]), dtype="<u2").astype(np.float64)
    return (q / layer["scale"]).reshape(layer["shape"])


@pytest.fixture(scope="module")
def client(model: GPT, tok: CharTokenizer):
    with TestClient(create_app(model, tok, model_name="tiny", max_batch=2)) as c:
        yield c


def test_route_sends_what_the_inspect_code_computes(client, model: GPT, tok: CharTokenizer) -> None:
    r = client.post("/v1/gptlab/inside", json={"text": TEXT, "layer": 3, "top": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    maps = attention_maps(model, tok, TEXT)
    assert body["attention_layer"]["layer"] == 3
    np.testing.assert_allclose(weights(body["attention_layer"]), maps[3].numpy(), atol=1e-4, rtol=0)
    logits = np.frombuffer(base64.b64decode(body["next_logits"]["data"]), dtype="<f4")
    with torch.no_grad():
        want = model(torch.tensor([tok.encode(TEXT)]))[0, -1]
    np.testing.assert_allclose(logits, want.numpy(), atol=1e-5, rtol=0)
    assert [t["id"] for t in body["distribution"]["top"]] == want.topk(4).indices.tolist()
    other = client.post("/v1/gptlab/inside/attention", json={"text": TEXT, "layer": 1}).json()
    np.testing.assert_allclose(weights(other), maps[1].numpy(), atol=1e-4, rtol=0)
    assert other["layer"] == 1 and other["n_head"] == 4


def test_route_keeps_the_last_tokens_within_the_limit(client) -> None:
    limits = client.get("/v1/gptlab/limits").json()
    assert limits["max_inside_tokens"] == min(MAX_INSIDE_TOKENS, 64)
    body = client.post("/v1/gptlab/inside", json={"text": "ab" * 50, "max_tokens": 10}).json()
    assert len(body["tokens"]) == 10 and body["dropped_tokens"] == 90
    long = client.post("/v1/gptlab/inside", json={"text": "x" * 100}).json()
    assert len(long["tokens"]) == 64 and long["dropped_tokens"] == 36  # the context is 64


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text": TEXT, "layer": 4}, "layer"),
        ({"text": TEXT, "kind": "cross"}, "kind"),
        ({"text": ""}, "text"),
        ({"text": TEXT, "top": 0}, "top"),
        ({"text": TEXT, "max_tokens": MAX_INSIDE_TOKENS + 1}, "max_tokens"),
        ({"text": TEXT, "layer": "1"}, "layer"),
    ],
)
def test_route_errors_name_the_field(client, body: dict, param: str) -> None:
    r = client.post("/v1/gptlab/inside", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_route_refuses_a_body_over_the_servers_limit(model: GPT, tok: CharTokenizer) -> None:
    with TestClient(create_app(model, tok, model_name="tiny", max_body_bytes=2048)) as c:
        r = c.post("/v1/gptlab/inside", json={"text": "a" * 4000})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert c.post("/v1/gptlab/inside", json={"text": "a" * 1000}).status_code == 200


def test_every_guide_anchor_is_a_heading_of_the_guide(model: GPT, tok: CharTokenizer) -> None:
    """The view links each stage to docs/guide/inside.md#anchor: each anchor is a heading there."""
    import re

    guide = ROOT / "docs" / "guide" / "inside.md"
    headings = {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", guide.read_text(), re.M)
    }
    view = inside(model, tok, TEXT).overview
    refs = [s["guide"] for s in view["stages"]] + [view["lens"]["guide"], view["attention"]["self"]["guide"]]
    for ref in refs:
        path, anchor = ref.split("#")
        assert path == "docs/guide/inside.md" and anchor in headings, ref


def test_route_refuses_another_model_and_is_in_the_openapi_schema(client) -> None:
    r = client.post("/v1/gptlab/inside", json={"text": TEXT, "model": "gpt-4"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    schema = client.get("/openapi.json").json()
    ref = schema["paths"]["/v1/gptlab/inside"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    fields = schema["components"]["schemas"][ref["$ref"].split("/")[-1]]["properties"]
    assert fields["max_tokens"]["maximum"] == MAX_INSIDE_TOKENS and fields["top"]["minimum"] == 1
    assert "/v1/gptlab/inside/attention" in schema["paths"]


def test_the_pages_scripts_share_no_global_name() -> None:
    """The playground's classic scripts share one global scope: a second ``function f`` replaces the first."""
    import re

    static = ROOT / "src" / "gptlab" / "serve" / "static"
    declared = re.compile(r"^(?:async\s+)?(?:function|const|let|var)\s+([A-Za-z_$][\w$]*)", re.M)
    scripts = re.findall(r'<script src="/static/([\w.]+)"', (static / "index.html").read_text())
    assert scripts == ["app.js", "inside.js", "inside_sampling.js", "inside_grammar.js"]
    seen: dict[str, str] = {}
    for name in scripts:
        for found in declared.findall((static / name).read_text()):
            assert found not in seen, f"{found} is declared in both {seen[found]} and {name}"
            seen[found] = name


def test_route_serves_an_encoder_decoders_three_kinds() -> None:
    tok = CharTokenizer.from_text("abcdefgh", special_tokens=["<|endoftext|>"])
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=tok.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16, arch="encoder-decoder"
    )
    model = build_model(config).eval()
    with TestClient(create_app(model, tok, model_name="ed")) as c:
        body = c.post("/v1/gptlab/inside", json={"text": "abcde"}).json()
        assert set(body["attention"]) == {"self", "cross", "encoder"}
        assert [t["token"] for t in body["source_tokens"]] == list("abcde") and len(body["tokens"]) == 1
        cross = c.post(
            "/v1/gptlab/inside/attention", json={"text": "abcde", "kind": "cross", "layer": 1}
        ).json()
        found = seq2seq_maps(model, tok, "abcde", target=[])
        np.testing.assert_allclose(weights(cross), found["cross"][1].numpy(), atol=1e-4, rtol=0)
        encoder = c.post("/v1/gptlab/inside/attention", json={"text": "abcde", "kind": "encoder"}).json()
        assert weights(encoder)[:, 0, 1:].sum() > 0  # bidirectional: the first source token sees later ones
