"""A GGUF file's conversion kept once (``gptlab.load(file, store=DIR)``, the CLI's ``--weights-cache``):
the kept model is the converted one exactly; a changed file, a damaged entry and a store that cannot
be written each fall back to converting, and none of them loses the load."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files")

from gguf import GGMLQuantizationType as Q  # noqa: E402

import gptlab  # noqa: E402
from gptlab.checkpoint import kept  # noqa: E402
from gptlab.cli import main  # noqa: E402
from gptlab.interop import gguf_kept  # noqa: E402
from gptlab.model.int4 import int4_supported  # noqa: E402
from tests.interop._gguf import tiny_llama, write_llama  # noqa: E402

pytestmark = pytest.mark.skipif(not int4_supported(16, 32), reason="this torch has no CPU int4 kernel")
IDS = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 7, 100, 200, 1, 64]])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)[0].float()


@pytest.fixture
def q4_file(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_llama(path, tiny_llama(), Q.Q4_1)
    return path


@pytest.fixture
def conversions(monkeypatch):
    """Counts the conversions of a GGUF file (what the store saves)."""
    calls = []
    real = gguf_kept.from_gguf_kept

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_kept, "from_gguf_kept", counted)
    return calls


def test_the_second_load_reads_the_kept_conversion_exactly(q4_file, tmp_path, conversions):
    store = tmp_path / "store"
    first, tok = gptlab.load(q4_file, store=store)
    second, tok2 = gptlab.load(q4_file, store=store)
    assert len(conversions) == 1  # the second load converted nothing
    assert second.quantization == first.quantization == "int4"
    torch.testing.assert_close(logits(second), logits(first), rtol=0, atol=0)
    assert tok2 is not None and tok is not None and tok2.encode("ab ba") == tok.encode("ab ba")
    assert getattr(tok2, "chat_template", None) == getattr(tok, "chat_template", None)
    plain, _ = gptlab.load(q4_file)  # no store: converted again, the same model
    torch.testing.assert_close(logits(plain), logits(second), rtol=0, atol=0)
    assert len(conversions) == 2 and len(list(store.iterdir())) == 1


def test_a_rewritten_file_is_converted_again(q4_file, tmp_path, conversions):
    store = tmp_path / "store"
    gptlab.load(q4_file, store=store)
    write_llama(q4_file, tiny_llama(seed=1), Q.Q4_1)  # another model under the same name
    model, _ = gptlab.load(q4_file, store=store)
    assert len(conversions) == 2
    torch.testing.assert_close(logits(model), logits(gptlab.load(q4_file)[0]), rtol=0, atol=0)


def test_a_damaged_entry_is_converted_again_with_a_warning(q4_file, tmp_path, conversions):
    store = tmp_path / "store"
    good, _ = gptlab.load(q4_file, store=store)
    (entry,) = store.iterdir()
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF  # one flipped byte
    weights.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="failed its check"):
        model, _ = gptlab.load(q4_file, store=store)
    assert len(conversions) == 2
    torch.testing.assert_close(logits(model), logits(good), rtol=0, atol=0)
    gptlab.load(q4_file, store=store)  # kept anew
    assert len(conversions) == 2


def test_a_store_that_cannot_be_written_costs_a_warning_not_the_load(q4_file, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.warns(UserWarning, match="could not be kept"):
        model, tok = gptlab.load(q4_file, store=blocker / "store")
    assert model.quantization == "int4" and tok is not None


def test_an_interrupted_write_leaves_no_entry(q4_file, tmp_path, monkeypatch):
    store = tmp_path / "store"

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)  # checkpoint files are written through os.replace
    with pytest.warns(UserWarning, match="could not be kept"):
        gptlab.load(q4_file, store=store)
    monkeypatch.undo()
    assert not store.exists() or list(store.iterdir()) == []
    assert kept.read_entry(kept.entry_for(q4_file, "keep", store)) is None


def test_the_cli_keeps_the_conversion_in_weights_cache(q4_file, tmp_path, capsys, conversions):
    store = tmp_path / "weights"
    argv = ["sample", str(q4_file), "--prompt", "ab", "--max-new-tokens", "4", "--temperature", "0"]
    assert main([*argv, "--weights-cache", str(store)]) == 0
    first = capsys.readouterr().out
    assert main([*argv, "--weights-cache", str(store)]) == 0
    assert capsys.readouterr().out == first and len(conversions) == 1
    shutil.rmtree(store)
    assert main([*argv, "--weights-cache", "none"]) == 0
    assert capsys.readouterr().out == first and not store.exists() and len(conversions) == 2


@pytest.mark.parametrize("kind", [Q.Q4_1, Q.Q8_0, Q.F32])
def test_auto_weights_are_known_from_the_kept_entry_as_from_the_header(tmp_path, monkeypatch, kind):
    """``--dtype auto`` of a GGUF file: ``keep`` where it holds quantized matrices. Once the store keeps
    its conversion, the header is not read again for that, and the answer is the header's."""
    from gptlab.cli.options import weights_format
    from gptlab.interop import gguf as gguf_reader

    path = tmp_path / "tiny.gguf"
    write_llama(path, tiny_llama(), kind)
    store = str(tmp_path / "store")
    from_header = weights_format("auto", "cpu", str(path), store=store)
    assert (from_header == "keep") is (kind != Q.F32)
    gptlab.load(path, store=store, quantize="keep")  # keeps the quantized files' conversions only
    assert kept.has_entry(path, "keep", store) is (kind != Q.F32)

    reads = []
    real = gguf_reader.read_gguf
    monkeypatch.setattr(gguf_reader, "read_gguf", lambda p: reads.append(p) or real(p))
    assert weights_format("auto", "cpu", str(path), store=store) == from_header
    assert len(reads) == (1 if kind == Q.F32 else 0)  # a float file has no entry: its header says
