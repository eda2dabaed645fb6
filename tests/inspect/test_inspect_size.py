"""gptlab.inspect.size: formulas agree with the instantiated model and the KV cache it allocates."""

from __future__ import annotations

import itertools
import json

import pytest

from gptlab import GPT, GPTConfig, GptlabError, KVCache
from gptlab.inspect import count_parameters, size_report
from gptlab.inspect.size import KV_DTYPES, load_config, meta_model

PARTS = (
    "embeddings",
    "positions",
    "attention",
    "feed_forward",
    "norms",
    "head",
    "total",
    "total_without_positions",
)


def _unique_numel(model: GPT) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def _check(config: GPTConfig) -> None:
    report = size_report(config)
    model = meta_model(config)
    counted = model.num_params()
    assert {k: report.value(k) for k in PARTS} == {k: counted[k] for k in PARTS}, config
    assert report.value("total") == _unique_numel(model)


@pytest.mark.parametrize("name", GPTConfig.preset_names())
def test_every_preset_matches_the_model(name: str) -> None:
    _check(GPTConfig.preset(name))


# every pos × mlp × attention kind; bias, tying and experts cycle through their values
_CORE = list(
    itertools.product(("learned", "sinusoidal", "rope", "alibi", "none"), ("gelu", "swiglu"), (4, 2, 1))
)
_FLAGS = list(itertools.product((True, False), (True, False), (0, 3)))  # bias, tie_embeddings, n_experts
GRID = [core + _FLAGS[i % len(_FLAGS)] for i, core in enumerate(_CORE)]


@pytest.mark.parametrize("pos,mlp,n_kv,bias,tie,experts", GRID)
def test_option_grid_matches_the_model(
    pos: str, mlp: str, n_kv: int, bias: bool, tie: bool, experts: int
) -> None:
    _check(
        GPTConfig(
            vocab_size=37,
            block_size=16,
            n_layer=2,
            n_head=4,
            n_kv_head=n_kv,
            n_embd=32,
            pos=pos,
            mlp=mlp,
            bias=bias,
            tie_embeddings=tie,
            n_experts=experts,
        )
    )


@pytest.mark.parametrize(
    "changes",
    [
        dict(norm="rmsnorm"),
        dict(norm_placement="post"),
        dict(qk_norm=True),
        dict(d_ff=100),
        dict(mlp="relu2", d_ff=48),
        dict(norm="rmsnorm", norm_placement="post", qk_norm=True, bias=False),
        dict(n_experts=4, experts_top_k=1),
    ],
)
def test_other_options_match_the_model(changes: dict) -> None:
    _check(GPTConfig(vocab_size=50, block_size=8, n_layer=3, n_head=2, n_embd=16, **changes))


def test_mha_attention_is_four_d_squared_and_ffn_eight_d_squared() -> None:
    c = GPTConfig.preset("gpt2", bias=False)
    r = size_report(c)
    assert r.value("attention") == c.n_layer * 4 * c.n_embd**2
    assert r.value("feed_forward") == c.n_layer * 8 * c.n_embd**2


@pytest.mark.parametrize(
    "config",
    [
        GPTConfig.preset("gpt2"),
        GPTConfig.preset("llama-tiny"),
        GPTConfig(vocab_size=30, block_size=12, n_layer=2, n_head=4, n_kv_head=1, n_embd=16, n_experts=3),
    ],
)
@pytest.mark.parametrize("kv_dtype", list(KV_DTYPES))
def test_kv_cache_bytes_match_the_allocated_cache(config: GPTConfig, kv_dtype: str) -> None:
    batch, context = 3, min(config.block_size, 40)
    report = size_report(config, context=context, batch=batch, kv_dtype=kv_dtype)
    cache = KVCache(config, batch, context, dtype=KV_DTYPES[kv_dtype][0])
    assert report.value("cache") == cache.nbytes()
    assert report.value("per token") * batch * context == cache.nbytes()


def test_forward_flops_formula() -> None:
    c = GPTConfig.preset("gpt2")
    r = size_report(c, context=512)
    model = meta_model(c)
    # weights a token multiplies: everything but the embedding lookup and the position table, plus the head
    n = sum(p.numel() for name, p in model.named_parameters() if not name.startswith(("wte", "positional")))
    n += c.vocab_size * c.n_embd
    assert r.value("N (multiplied weights)") == n
    assert r.value("forward") == 2 * n + 2 * c.n_layer * 512 * c.n_embd
    assert r.value("training") == 3 * r.value("forward")


def test_moe_counts_only_active_experts_in_flops() -> None:
    dense = GPTConfig(vocab_size=40, block_size=8, n_layer=2, n_head=2, n_embd=16)
    moe = dense.replace(n_experts=4, experts_top_k=2)
    ffn_one = size_report(dense).value("feed_forward") // dense.n_layer
    router = dense.n_embd * 4
    assert size_report(moe).value("N (multiplied weights)") == size_report(dense).value(
        "N (multiplied weights)"
    ) + dense.n_layer * (ffn_one + router)


def test_training_memory_adds_up_and_scales_with_dtype() -> None:
    c = GPTConfig.preset("char-tiny")
    r32, r16 = size_report(c, dtype="fp32"), size_report(c, dtype="bf16")
    p = r32.value("total")
    assert r32.value("weights") == 4 * p and r16.value("weights") == 2 * p
    for r in (r32, r16):
        mem = {f.name: f.value for f in r.training_memory}
        assert (
            mem["total"]
            == mem["weights"]
            + mem["gradients"]
            + mem["optimizer (2 moments)"]
            + mem["activations (estimate)"]
        )
    assert size_report(c, batch=4).value("activations (estimate)") > r32.value("activations (estimate)")


def test_every_figure_has_a_formula_and_json_round_trips() -> None:
    r = size_report(GPTConfig.preset("llama-tiny"), context=128, batch=2, dtype="bf16")
    data = json.loads(json.dumps(r.to_dict()))
    figures = [f for s in ("parameters", "compute", "kv_cache", "training_memory") for f in data[s]]
    assert figures and all(f["formula"] for f in figures)
    text = r.render()
    assert all(f["formula"] in text for f in figures)


def test_count_parameters_uses_meta_and_matches_report() -> None:
    c = GPTConfig.preset("gpt2-xl")
    assert count_parameters(c)["total"] == size_report(c).value("total")


@pytest.mark.parametrize(
    "kwargs", [dict(dtype="int4"), dict(dtype="int8"), dict(kv_dtype="int4"), dict(context=0), dict(batch=-1)]
)
def test_bad_arguments_are_gptlab_errors(kwargs: dict) -> None:
    with pytest.raises(GptlabError):
        size_report(GPTConfig.preset("gpt2"), **kwargs)


def test_load_config_from_json_files(tmp_path) -> None:
    c = GPTConfig.preset("llama-tiny")
    plain = tmp_path / "plain.json"
    plain.write_text(c.to_json())
    assert load_config(config_file=str(plain))[0] == c
    from gptlab.checkpoint import write_config

    write_config(tmp_path / "config.json", c)
    assert load_config(config_file=str(tmp_path / "config.json"))[0] == c
    assert load_config(model=str(tmp_path))[0] == c
    (tmp_path / "bad.json").write_text('{"n_layer": "x"}')
    with pytest.raises(GptlabError):
        load_config(config_file=str(tmp_path / "bad.json"))
    with pytest.raises(GptlabError):
        load_config(preset="gpt2", config_file=str(plain))
