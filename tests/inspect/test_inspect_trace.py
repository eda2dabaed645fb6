"""gptlab.inspect.trace and attention_maps: the numbers shown are the model's own."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gptlab import GPT, GptlabError
from gptlab.inspect import attention_maps, trace
from gptlab.tokenizers import CharTokenizer
from tests._tiny import tiny_model

CORPUS = "The cat sat on the mat.\nA dog ran in the fog!\t$5 "
TEXT = "The cat sat on\n"

OPTIONS = [
    dict(pos="learned"),
    dict(pos="sinusoidal", norm="rmsnorm"),
    dict(pos="rope", n_kv_head=2, mlp="swiglu", bias=False, tie_embeddings=False),
    dict(pos="alibi", n_kv_head=1, norm_placement="post"),
    dict(pos="none", n_experts=3, qk_norm=True, logit_softcap=5.0),
]


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(CORPUS)


def _model(tok: CharTokenizer, **options) -> GPT:
    return tiny_model(vocab_size=tok.vocab_size, init_std=0.2, **options)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o["pos"])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.0])
def test_top_probabilities_are_softmax_of_the_models_logits(tok, options, temperature) -> None:
    model = _model(tok, **options)
    t = trace(model, tok, TEXT, temperature=temperature)
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode(TEXT)]))[0, -1]  # the fast (sdpa) path
    probs = torch.softmax(logits / temperature, dim=-1)
    want_p, want_i = probs.topk(10)
    assert [x["id"] for x in t.next_tokens] == want_i.tolist()
    assert [x["prob"] for x in t.next_tokens] == pytest.approx(want_p.tolist(), abs=1e-5)
    assert [x["logit"] for x in t.next_tokens] == pytest.approx(logits[want_i].tolist(), abs=1e-4)
    assert len(t.layers) == 2 and all(len(layer["attention"]) == 4 for layer in t.layers)


def test_temperature_zero_is_greedy(tok) -> None:
    model = _model(tok)
    t = trace(model, tok, TEXT, temperature=0, top=3)
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode(TEXT)]))[0, -1]
    assert t.next_tokens[0]["id"] == int(logits.argmax())
    assert [x["prob"] for x in t.next_tokens] == [1.0, 0.0, 0.0]


def test_trace_stages_describe_the_input(tok) -> None:
    model = _model(tok)
    t = trace(model, tok, TEXT)
    ids = tok.encode(TEXT)
    assert [x["id"] for x in t.tokens] == ids
    assert t.tokens[-1]["token"] == "\\n"  # control characters escaped
    assert t.embedding["shape"] == [len(ids), 32]
    assert t.embedding["rows"][1]["values"] == pytest.approx(model.wte.weight[ids[1], :4].tolist(), abs=1e-4)
    assert t.position["rows"][2]["values"] == pytest.approx(
        model.positional.wpe.weight[2, :4].tolist(), abs=1e-4
    )
    with torch.no_grad():
        out = model.run(torch.tensor([ids]), output_hidden_states=True)
    for layer, h in zip(t.layers, out.hidden_states[1:]):
        assert layer["residual_norms"] == pytest.approx(h[0].norm(dim=-1).tolist(), abs=1e-3)
    maps = attention_maps(model, tok, TEXT)
    for layer in t.layers:
        for head in layer["attention"]:
            row = maps[layer["layer"], head["head"], -1]
            assert [a["weight"] for a in head["top"]] == pytest.approx(row.topk(3).values.tolist(), abs=1e-4)
    text = t.render()
    for stage in (
        "1. Tokens",
        "2. Token embeddings",
        "3. Position",
        "4. Transformer",
        "5. Final",
        "6. Logits",
        "7. Next token",
    ):
        assert stage in text
    data = json.loads(json.dumps(t.to_dict()))
    assert data["next_tokens"] == t.next_tokens


@pytest.mark.parametrize(
    "pos,where",
    [("rope", "inside every attention layer"), ("alibi", "distance penalty"), ("none", "causal mask")],
)
def test_position_stage_says_where_position_enters(tok, pos, where) -> None:
    t = trace(_model(tok, pos=pos), tok, TEXT)
    assert where in t.position["where"] and "rows" not in t.position


def test_ids_without_tokenizer(tok) -> None:
    model = _model(tok)
    ids = tok.encode(TEXT)
    t = trace(model, None, ids)
    assert t.tokens[0]["token"] == f"#{ids[0]}"
    assert t.next_tokens == [dict(x, token=f"#{x['id']}") for x in trace(model, tok, TEXT).next_tokens]


@pytest.mark.parametrize("text,tokenizer", [("", True), ("Zebra", True), ("x" * 40, False), ("hi", False)])
def test_bad_input_is_a_gptlab_error(tok, text, tokenizer) -> None:
    model = _model(tok)
    arg = text if tokenizer or text == "hi" else [1] * 40
    with pytest.raises(GptlabError):
        trace(model, tok if tokenizer else None, arg)


@pytest.mark.parametrize("bad", [-1.0, math.nan])
def test_bad_temperature(tok, bad) -> None:
    with pytest.raises(GptlabError):
        trace(_model(tok), tok, TEXT, temperature=bad)


def _manual_attention(model: GPT, hidden: list[torch.Tensor]) -> torch.Tensor:
    """softmax(Q·Kᵀ/√d_k + M) from each block's own weights and its input (pre-norm, learned positions)."""
    maps = []
    c = model.config
    for block, h in zip(model.blocks, hidden[:-1]):
        kv = c.n_kv_head * c.head_dim
        q, k, _ = block.attn.qkv(block.norm1(h)).split([c.n_embd, kv, kv], dim=-1)
        T = h.size(1)
        q = q.view(1, T, c.n_head, c.head_dim).transpose(1, 2)
        k = k.view(1, T, c.n_kv_head, c.head_dim).transpose(1, 2).repeat_interleave(c.n_rep, dim=1)
        q, k = model.positional.rotate(q, k, torch.arange(T))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c.head_dim)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        maps.append(torch.softmax(scores, dim=-1)[0])
    return torch.stack(maps)


@pytest.mark.parametrize(
    "options", [dict(pos="learned"), dict(pos="rope", n_kv_head=2)], ids=["mha", "rope-gqa"]
)
def test_attention_maps_equal_the_attention_equation(tok, options) -> None:
    model = _model(tok, **options)
    ids = tok.encode(TEXT)
    maps = attention_maps(model, tok, TEXT)
    T = len(ids)
    assert maps.shape == (2, 4, T, T)
    with torch.no_grad():
        out = model.run(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
        manual = _manual_attention(model, out.hidden_states)
    torch.testing.assert_close(maps, torch.stack([a[0] for a in out.attentions]))
    torch.testing.assert_close(maps, manual, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, T))
    assert (maps.triu(1) == 0).all()  # nothing attends to the future
    torch.testing.assert_close(attention_maps(model, ids), maps)
