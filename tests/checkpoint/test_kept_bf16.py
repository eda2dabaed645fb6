"""A float32 checkpoint run in bf16 on the CPU through its bf16 copy, kept once (``gptlab.load(ckpt,
quantize="bf16", store=DIR)``, the CLI's ``--weights-cache``): the model read from the copy is the one
converted from float32 exactly; a changed checkpoint gets a new copy; a damaged copy is made again
with a warning; a store that cannot be written costs a warning, not the load; a bf16 checkpoint needs
no copy."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open

import gptlab
from gptlab.checkpoint import kept
from gptlab.cli import main
from gptlab.tokenizers import CharTokenizer

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
TEXT = "abcdefghij klmnop\n"


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)[0].float()


@pytest.fixture
def ckpt(tmp_path, tiny_model):
    tok = CharTokenizer.from_text(TEXT)
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32, pos="rope", norm="rmsnorm")
    return gptlab.save(model.float(), tok, tmp_path / "ckpt")


@pytest.fixture
def reads(monkeypatch):
    """The float32 checkpoints read for bf16 (what the copy saves): their paths."""
    from gptlab import checkpoint

    calls: list[str] = []
    real = checkpoint.load

    def counted(path, *args, **kwargs):
        calls.append(os.path.basename(str(path)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "load", counted)
    return calls


def test_the_kept_copy_gives_the_converted_model_exactly(ckpt, tmp_path, reads):
    store = tmp_path / "store"
    direct, _ = gptlab.load(ckpt, quantize="bf16")
    first, _ = gptlab.load(ckpt, quantize="bf16", store=store)
    reads.clear()
    second, tok = gptlab.load(ckpt, quantize="bf16", store=store)
    assert reads == []  # the checkpoint itself was not read again: the copy was
    assert direct.quantization == first.quantization == second.quantization == "bf16"
    (entry,) = store.iterdir()
    with safe_open(str(entry / "model.safetensors"), framework="pt") as f:  # the copy holds bf16
        assert {f.get_slice(name).get_dtype() for name in f.keys()} == {"BF16"}
    torch.testing.assert_close(logits(second), logits(direct), rtol=0, atol=0)
    torch.testing.assert_close(logits(first), logits(direct), rtol=0, atol=0)
    assert tok is not None and tok.encode("abc") == CharTokenizer.from_text(TEXT).encode("abc")


def test_a_changed_checkpoint_gets_a_new_copy(ckpt, tmp_path):
    store = tmp_path / "store"
    gptlab.load(ckpt, quantize="bf16", store=store)
    config = ckpt / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # touched
    gptlab.load(ckpt, quantize="bf16", store=store)
    assert len(list(store.iterdir())) == 2


def test_a_damaged_copy_is_made_again_with_a_warning(ckpt, tmp_path):
    store = tmp_path / "store"
    direct, _ = gptlab.load(ckpt, quantize="bf16")
    gptlab.load(ckpt, quantize="bf16", store=store)
    entry = kept.entry_for(ckpt, "bf16", store)
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="a kept conversion failed its check and is made again"):
        again, _ = gptlab.load(ckpt, quantize="bf16", store=store)
    torch.testing.assert_close(logits(again), logits(direct), rtol=0, atol=0)
    assert (entry / "config.json").is_file()  # made again


def test_a_store_that_cannot_be_written_costs_a_warning_not_the_load(ckpt, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    direct, _ = gptlab.load(ckpt, quantize="bf16")
    with pytest.warns(UserWarning, match="could not be kept"):
        model, _ = gptlab.load(ckpt, quantize="bf16", store=blocked / "store")
    torch.testing.assert_close(logits(model), logits(direct), rtol=0, atol=0)


def test_a_bf16_checkpoint_is_read_as_it_is(tmp_path, tiny_model):
    tok = CharTokenizer.from_text(TEXT)
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32).to(torch.bfloat16)
    path = gptlab.save(model, tok, tmp_path / "bf16")
    store = tmp_path / "store"
    loaded, _ = gptlab.load(path, quantize="bf16", store=store)
    assert not store.exists() or not any(store.iterdir())  # no copy of a copy
    torch.testing.assert_close(logits(loaded), logits(gptlab.load(path, quantize="bf16")[0]), rtol=0, atol=0)


def test_the_cli_keeps_the_copy_in_weights_cache(ckpt, tmp_path, capsys):
    store = tmp_path / "store"
    args = ["sample", str(ckpt), "--prompt", "abc", "--max-new-tokens", "6", "--temperature", "0"]
    assert main([*args, "--dtype", "bf16", "--weights-cache", "none"]) == 0
    direct = capsys.readouterr().out
    for _ in range(2):
        assert main([*args, "--dtype", "bf16", "--weights-cache", str(store)]) == 0
        assert capsys.readouterr().out == direct
    assert len(list(store.iterdir())) == 1


@pytest.mark.parametrize("damage", ["missing", "changed"])
def test_a_broken_checkpoint_is_refused_as_without_the_copy(ckpt, tmp_path, damage):
    """A checkpoint with its weights missing or changed is one ``GptlabError`` naming the problem,
    through the kept copy's path as without it, and no copy is made of it."""
    from gptlab.errors import GptlabError

    weights = ckpt / "model.safetensors"
    if damage == "missing":
        weights.unlink()
    else:
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    with pytest.raises(GptlabError) as direct:
        gptlab.load(ckpt, quantize="bf16")
    store = tmp_path / "store"
    with pytest.raises(GptlabError) as kept_path:
        gptlab.load(ckpt, quantize="bf16", store=store)
    assert str(kept_path.value) == str(direct.value)
    assert not store.exists() or not any(store.iterdir())
