"""Checkpoints: safetensors + JSON, atomic, and every bad file named in a clear error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import gptlab
from gptlab import GPT, GptlabError
from gptlab.checkpoint import list_checkpoints, resolve_checkpoint
from gptlab.checkpoint.integrity import write_checksums
from gptlab.tokenizers import CharTokenizer
from tests._tiny import tiny_model


def tiny(**kw) -> GPT:
    return tiny_model(vocab_size=30, block_size=16, n_head=2, n_embd=16, **kw)


@pytest.mark.parametrize(
    "options", [{}, {"tie_embeddings": False, "pos": "rope", "mlp": "swiglu", "n_kv_head": 1}]
)
def test_save_and_load_round_trip_with_a_tokenizer(tmp_path: Path, options: dict) -> None:
    model = tiny(**options)
    tok = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz .,\n")
    gptlab.save(model, tok, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "checksums.json",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    loaded, loaded_tok = gptlab.load(tmp_path / "ckpt")
    idx = torch.randint(0, 30, (2, 12))
    assert torch.equal(model(idx), loaded(idx))
    assert loaded.config == model.config
    assert loaded_tok is not None and loaded_tok.encode("hello") == tok.encode("hello")
    if model.config.tie_embeddings:  # the tied head is stored once and tied again on load
        assert loaded.lm_head.weight.data_ptr() == loaded.wte.weight.data_ptr()


def test_files_are_safetensors_and_json_never_pickle(tmp_path: Path) -> None:
    gptlab.save(tiny(), None, tmp_path)
    header_len = int.from_bytes((tmp_path / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "model.safetensors").read_bytes()[8 : 8 + header_len])
    assert "wte.weight" in header and "lm_head.weight" not in header
    assert json.loads((tmp_path / "config.json").read_text())["gptlab_format"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary files left
    assert oct(os.stat(tmp_path / "config.json").st_mode & 0o777) != oct(0o600)  # normal permissions


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    gptlab.save(tiny(), None, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(GptlabError, match=r"model\.safetensors: missing, but checksums\.json lists it"):
        gptlab.load(tmp_path)
    write_checksums(tmp_path)  # a record made after the loss: the reader's own check names the file
    with pytest.raises(GptlabError, match=r"model\.safetensors: file not found"):
        gptlab.load(tmp_path)


def test_a_truncated_weights_file_is_named(tmp_path: Path) -> None:
    gptlab.save(tiny(), None, tmp_path)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(GptlabError, match=r"model\.safetensors: SHA-256 differs"):
        gptlab.load(tmp_path)
    write_checksums(tmp_path)
    with pytest.raises(GptlabError, match=r"model\.safetensors: not a valid safetensors file"):
        gptlab.load(tmp_path)


def test_a_corrupt_config_is_named(tmp_path: Path) -> None:
    gptlab.save(tiny(), None, tmp_path)
    (tmp_path / "config.json").write_text('{"gptlab_format": 1, "model": {')
    write_checksums(tmp_path)
    with pytest.raises(GptlabError, match=r"config\.json: not valid JSON"):
        gptlab.load(tmp_path)


def test_weights_that_do_not_match_the_config_are_named(tmp_path: Path) -> None:
    gptlab.save(tiny(), None, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model"]["n_embd"] = 32
    config["model"]["d_ff"] = 128
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_checksums(tmp_path)
    with pytest.raises(GptlabError, match=r"model\.safetensors: tensor .* has shape"):
        gptlab.load(tmp_path)
    config["model"].update(n_embd=16, d_ff=64, n_layer=3)
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_checksums(tmp_path)
    with pytest.raises(
        GptlabError, match=r"model\.safetensors: weights do not match config\.json .*missing: blocks\.2"
    ):
        gptlab.load(tmp_path)


def test_a_hugging_face_directory_is_read_as_one(tmp_path: Path) -> None:
    """gptlab.load opens any source: a folder with a Hugging Face config.json is read as such (here its
    config lacks what a GPT-2 needs), not refused as a checkpoint without a gptlab config."""
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(GptlabError, match=r"config\.json: missing 'n_embd'"):
        gptlab.load(tmp_path)


def test_run_directories_resolve_to_the_latest_complete_checkpoint(tmp_path: Path) -> None:
    for step in (100, 300, 200):
        gptlab.save(tiny(), None, tmp_path / f"ckpt-{step:06d}")
    (tmp_path / ".tmp-ckpt-000400").mkdir()  # a half-written one is never picked
    (tmp_path / "ckpt-000500").mkdir()  # nor one without a config
    assert [s for s, _ in list_checkpoints(tmp_path)] == [100, 200, 300]
    assert resolve_checkpoint(tmp_path).name == "ckpt-000300"
    model, _ = gptlab.load(tmp_path)
    assert isinstance(model, GPT)
    with pytest.raises(GptlabError, match="not a gptlab checkpoint or run directory"):
        gptlab.load(tmp_path / "ckpt-000500")
    with pytest.raises(GptlabError, match="no such checkpoint"):
        gptlab.load(tmp_path / "nope")


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_changed_file_is_refused_by_its_checksum_whatever_breaks_first(
    tmp_path: Path, name: str, damage: str
) -> None:
    """Whether the damaged file would break the reading (truncated) or not (one flipped bit), the error
    is the checksum's, naming the file."""
    from gptlab.tokenizers import CharTokenizer

    gptlab.save(tiny(), CharTokenizer.from_text("abcdefgh"), tmp_path)
    data = bytearray((tmp_path / name).read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[-3] ^= 0x01
    (tmp_path / name).write_bytes(bytes(data))
    with pytest.raises(GptlabError, match=rf"{name.replace('.', '[.]')}: SHA-256 differs"):
        gptlab.load(tmp_path)
    write_checksums(tmp_path)  # the damage recorded: now the reader's own check speaks, if it can tell
    if damage == "truncated":
        with pytest.raises(GptlabError, match=rf"{name.replace('.', '[.]')}(: not a valid|' is corrupt)"):
            gptlab.load(tmp_path)
