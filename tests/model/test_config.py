"""GPTConfig: presets, validation messages, JSON round trip."""

from __future__ import annotations

import json

import pytest

from gptlab import GPT, GPTConfig, GptlabError


@pytest.mark.parametrize("name", GPTConfig.preset_names())
def test_presets_round_trip_through_json(name: str) -> None:
    config = GPTConfig.preset(name)
    again = GPTConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert GPTConfig.from_json(config.to_json()) == config


def test_required_presets_have_the_documented_shapes() -> None:
    for name, (layers, heads, d) in {
        "gpt2": (12, 12, 768),
        "gpt2-medium": (24, 16, 1024),
        "gpt2-large": (36, 20, 1280),
        "gpt2-xl": (48, 25, 1600),
    }.items():
        c = GPTConfig.preset(name)
        assert (c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.block_size) == (layers, heads, d, 50257, 1024)
        assert c.tie_embeddings and c.pos == "learned"
    llama = GPTConfig.preset("llama-tiny")
    assert (llama.pos, llama.norm, llama.mlp, llama.tie_embeddings) == ("rope", "rmsnorm", "swiglu", False)
    assert llama.n_kv_head is not None and 1 < llama.n_kv_head < llama.n_head
    sc = GPTConfig.preset("char-tiny")
    assert (sc.n_layer, sc.n_head, sc.n_embd, sc.block_size) == (4, 4, 128, 64)


def test_gpt2_parameter_count_is_124_439_808() -> None:
    import torch

    with torch.device("meta"):
        model = GPT(GPTConfig.preset("gpt2"))
    counts = model.num_params()
    assert counts["total"] == 124_439_808
    assert counts["head"] == 0  # tied: counted once, under embeddings
    assert counts["total"] == sum(
        v for k, v in counts.items() if k not in ("total", "total_without_positions")
    )
    assert counts["total_without_positions"] == 124_439_808 - 1024 * 768


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (dict(n_embd=100, n_head=3), "n_embd (100) must be divisible by n_head (3)"),
        (dict(n_head=4, n_kv_head=3, n_embd=32), "n_head (4) must be divisible by n_kv_head (3)"),
        (dict(pos="spiral"), "pos must be one of"),
        (dict(norm="batchnorm"), "norm must be one of"),
        (dict(mlp="tanh"), "mlp must be one of"),
        (dict(norm_placement="middle"), "norm_placement must be one of"),
        (dict(dropout=1.5), "dropout"),
        (dict(n_experts=1), "n_experts"),
        (dict(n_experts=4, experts_top_k=5), "experts_top_k"),
        (dict(vocab_size=0), "vocab_size must be a positive integer"),
        (dict(pos="rope", n_embd=36, n_head=4), "even head size"),
    ],
)
def test_invalid_combinations_say_what_to_change(changes: dict, fragment: str) -> None:
    base = dict(vocab_size=10, block_size=8, n_layer=1, n_head=4, n_embd=32)
    base.update(changes)
    with pytest.raises(GptlabError, match="invalid model config") as info:
        GPTConfig(**base)
    assert fragment in str(info.value)


def test_unknown_keys_and_presets_are_clear_errors() -> None:
    with pytest.raises(GptlabError, match="unknown model config key.*n_layers.*valid keys"):
        GPTConfig.from_dict({"n_layers": 3})
    with pytest.raises(GptlabError, match="unknown preset 'gpt5'"):
        GPTConfig.preset("gpt5")


def test_d_ff_defaults_follow_the_mlp_kind() -> None:
    assert GPTConfig(n_embd=96, n_head=4, mlp="gelu").d_ff == 4 * 96
    gated = GPTConfig(n_embd=96, n_head=4, mlp="swiglu").d_ff
    assert gated is not None and gated % 64 == 0 and gated >= 8 * 96 / 3


def test_option_names_are_the_registries_keys() -> None:
    """Every registered variant is accepted and builds; any other name is refused, naming the choices."""
    import torch

    from gptlab.model import MODELS, build_model
    from gptlab.model import config as model_config
    from gptlab.model.block import RESIDUALS
    from gptlab.model.mlp import GATE_ACTIVATIONS, MLPS
    from gptlab.model.norms import NORMS
    from gptlab.model.positional import POSITIONAL

    registries = {
        "pos": POSITIONAL,
        "norm": NORMS,
        "norm_placement": RESIDUALS,
        "mlp": MLPS,
        "glu_act": GATE_ACTIVATIONS,
        "arch": MODELS,
    }
    assert set(model_config.REGISTRIES) == set(registries)
    assert model_config.MLP_OPTIONS == tuple(MLPS) and model_config.POS_OPTIONS == tuple(POSITIONAL)
    assert model_config.NORM_OPTIONS == tuple(NORMS)
    assert model_config.PLACEMENT_OPTIONS == tuple(RESIDUALS)
    for option, registry in registries.items():
        for name in registry:
            config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, **{option: name})
            source = {"source": torch.zeros(1, 3, dtype=torch.long)} if name == "encoder-decoder" else {}
            assert build_model(config)(torch.zeros(1, 4, dtype=torch.long), **source).shape == (1, 4, 11)
        with pytest.raises(GptlabError, match=f"{option} must be one of {', '.join(registry)}"):
            GPTConfig(**{option: "no-such-variant"})


def test_an_unknown_preset_is_one_error_naming_the_presets() -> None:
    with pytest.raises(GptlabError, match="unknown preset 'shakespeare-char'; choose one of .*char-tiny"):
        GPTConfig.preset("shakespeare-char")
