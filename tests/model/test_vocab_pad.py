"""Vocabulary padding (``GPTConfig.vocab_multiple``) is invisible: logits, loss, checkpoints, export."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import gptlab
from gptlab.checkpoint import load_model_state, model_state
from gptlab.errors import GptlabError
from gptlab.generate import generate_ids
from gptlab.generate.static import StaticSession
from gptlab.model import GPT, GPTConfig

SHAPE = dict(vocab_size=61, block_size=16, n_layer=2, n_head=4, n_embd=32, init_std=0.3)


def pair(**options) -> tuple[GPT, GPT]:
    """An unpadded model and a padded one holding the same real weights."""
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**SHAPE, **options)).eval()
    padded = GPT(GPTConfig(**SHAPE, vocab_multiple=64, **options)).eval()
    load_model_state(padded, model_state(plain), "test")
    return plain, padded


def test_padded_sizes():
    assert GPTConfig.preset("gpt2", vocab_multiple=64).padded_vocab_size == 50304
    assert GPTConfig.preset("gpt2").padded_vocab_size == 50257
    assert GPTConfig(**SHAPE, vocab_multiple=64).padded_vocab_size == 64
    _, padded = pair()
    assert padded.wte.weight.shape == (64, 32) and padded.lm_head.weight is padded.wte.weight
    with pytest.raises(GptlabError, match="vocab_multiple"):
        GPTConfig(**SHAPE, vocab_multiple=0)
    # parameter counts are the real vocabulary's, as gptlab size reports them
    from gptlab.inspect.size import size_report

    config = GPTConfig.preset("gpt2", vocab_multiple=64)
    with torch.device("meta"):
        counts = GPT(config).num_params()
    assert counts["total"] == 124_439_808 == size_report(config).value("total")


@pytest.mark.parametrize("options", [dict(), dict(tie_embeddings=False, pos="rope", logit_softcap=20.0)])
def test_logits_and_loss_are_unchanged_and_padding_gets_no_gradient(options):
    plain, padded = pair(**options)
    with torch.no_grad():  # even a huge padding row can neither win a softmax nor change the loss
        padded.lm_head.weight[61:] = 100.0
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 61, (3, 12), generator=g), torch.randint(0, 61, (3, 12), generator=g)
    y[0, :3] = -1  # ignored targets stay ignored
    logits_a, loss_a = plain(x, y)
    logits_b, loss_b = padded(x, y)
    assert logits_b.shape == (3, 12, 61)
    torch.testing.assert_close(logits_b, logits_a, atol=1e-6, rtol=0)
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=0)
    loss_b.backward()
    assert torch.count_nonzero(padded.lm_head.weight.grad[61:]) == 0
    assert torch.count_nonzero(padded.lm_head.weight.grad[:61]) > 0


def test_padding_is_never_sampled():
    _, padded = pair()
    with torch.no_grad():
        padded.lm_head.weight[61:] = 100.0
    idx = torch.zeros(8, 1, dtype=torch.long)
    out = generate_ids(padded, idx, 12, temperature=2.0, seed=0)
    assert int(out.max()) < 61
    session = StaticSession(padded, 8, 16, step="eager")  # the in-graph sampler sees real columns only
    from gptlab.generate import SampleConfig

    cfg = SampleConfig(temperature=2.0)
    first = session.add_many([[0]] * 8, [cfg] * 8, list(range(8)))
    tokens = [t for _, t in first] + [
        t for _ in range(10) for t in session.step([s for s, _ in first]).values()
    ]
    assert max(tokens) < 61


def test_checkpoints_hold_the_real_vocabulary(tmp_path):
    plain, padded = pair()
    gptlab.save(padded, None, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())["model"]
    assert config["vocab_size"] == 61 and config["vocab_multiple"] == 64
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        assert f.get_slice("wte.weight").get_shape() == [61, 32]
    loaded, _ = gptlab.load(tmp_path / "ckpt")
    assert loaded.wte.weight.shape == (64, 32) and torch.count_nonzero(loaded.wte.weight[61:]) == 0
    x = torch.randint(0, 61, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), plain(x), atol=1e-6, rtol=0)
    # and an unpadded checkpoint loads into a padded model (the config says how to pad)
    gptlab.save(plain, None, tmp_path / "plain")
    again = GPT(GPTConfig(**SHAPE, vocab_multiple=64))
    load_model_state(again, model_state(gptlab.load(tmp_path / "plain")[0]), "plain")
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), plain(x), atol=1e-6, rtol=0)


def test_hugging_face_export_has_the_real_vocabulary(tmp_path):
    transformers = pytest.importorskip("transformers")
    plain, padded = pair(pos="learned", mlp="gelu_tanh")
    out = gptlab.to_hf(padded, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 61
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.randint(0, 61, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, plain(x), atol=1e-4, rtol=0)
