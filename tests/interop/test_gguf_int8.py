"""int8 from GGUF files and checkpoints: converted tensor by tensor, saved as int8 + scales, loaded back
as the same model; and BOS added exactly where the file says so (as transformers' tokenizer does)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors import safe_open  # noqa: E402

import gptlab  # noqa: E402
from gptlab.checkpoint.integrity import write_checksums  # noqa: E402
from gptlab.cli import main  # noqa: E402
from gptlab.errors import GptlabError  # noqa: E402
from gptlab.interop.gguf import from_gguf, tokenizer_from_gguf  # noqa: E402
from gptlab.model.quantized import Int8Embedding, Int8Linear  # noqa: E402
from gptlab.tokenizers.chat import encode_chat  # noqa: E402
from tests.interop._gguf import tiny_llama, write_llama  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
IDS = torch.tensor([[0, 5, 77, 258, 259, 100, 3, 9, 200, 31]])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def gguf_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama(path, tiny_llama(tie=request.param), Q.Q8_0)
    return path


def test_converting_while_loading_equals_quantizing_the_float_model(gguf_file):
    reference = gptlab.quantize(from_gguf(gguf_file), "int8")
    streamed = from_gguf(gguf_file, quantize="int8")
    assert streamed.quantization == "int8" and isinstance(streamed.wte, Int8Embedding)
    assert all(not isinstance(m, torch.nn.Linear) for m in streamed.modules())  # every matrix converted
    if streamed.config.tie_embeddings:  # the tied table is the head's int8 matrix, stored once
        assert streamed.wte.weight is streamed.lm_head.weight
    torch.testing.assert_close(logits(streamed), logits(reference), rtol=0, atol=0)
    bf16 = from_gguf(gguf_file, quantize="bf16")
    float_model = from_gguf(gguf_file)
    torch.testing.assert_close(logits(bf16), logits(gptlab.quantize(float_model, "bf16")), rtol=0, atol=0)


def test_int8_costs_little_accuracy_and_a_quarter_of_the_memory(gguf_file):
    float_model = from_gguf(gguf_file)
    int8 = from_gguf(gguf_file, quantize="int8")
    ref = logits(float_model)
    assert (logits(int8) - ref).abs().max() < 0.05 * ref.abs().max()
    matrices = [m for m in int8.modules() if isinstance(m, Int8Linear | Int8Embedding)]
    held = {t.data_ptr(): t.numel() * t.element_size() for m in matrices for t in (m.weight, m.scales)}
    floats = sum(p.numel() * 4 for n, p in float_model.named_parameters() if p.dim() == 2)
    assert sum(held.values()) < 0.3 * floats


def test_convert_int8_checkpoint_round_trips(gguf_file, tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert main(["convert", "--from-gguf", str(gguf_file), "--out", str(out), "--dtype", "int8"]) == 0
    assert "int8" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["format"] == "int8"
    with safe_open(str(out / "model.safetensors"), "pt") as f:  # safetensors: no pickle
        names = set(f.keys())
        assert f.get_tensor("blocks.0.attn.qkv.weight").dtype == torch.int8
        assert f.get_tensor("wte.weight").dtype == torch.int8
        assert f.get_tensor("blocks.0.attn.qkv.scales").shape == (
            f.get_tensor("blocks.0.attn.qkv.weight").shape[0],
        )
    tied = config["model"]["tie_embeddings"]
    assert ("lm_head.weight" in names) != tied  # a tied head is stored once, as the table
    model, tok = gptlab.load(out)
    assert model.quantization == "int8" and tok is not None
    # int8 matrices own 64-byte-aligned memory (the fused kernel's AVX-512 path faults on a view into
    # the file's memory map at an unaligned offset; AVX2 machines do not, so the property is checked)
    int8 = [t for t in model.state_dict().values() if t.dtype == torch.int8]
    assert int8 and all(t.data_ptr() % 64 == 0 for t in int8)
    in_memory = from_gguf(gguf_file, quantize="int8")
    held = in_memory.state_dict()
    for name, t in model.state_dict().items():  # the same int8 weights and scales, bit for bit
        assert torch.equal(t, held[name]), name
    # the same logits (to float32 rounding: on the H100 machine's 16-core CPU the two models'
    # products were not bitwise equal, as they are here)
    torch.testing.assert_close(logits(model), logits(in_memory), rtol=1e-5, atol=1e-6)
    again = tmp_path / "again"
    gptlab.save(model, tok, again)  # an int8 model saves as it is held
    torch.testing.assert_close(logits(gptlab.load(again)[0]), logits(in_memory), rtol=1e-5, atol=1e-6)
    assert gptlab.load(out, quantize="int8")[0].quantization == "int8"


def test_an_int8_checkpoint_refuses_what_it_cannot_do(gguf_file, tmp_path, capsys):
    out = tmp_path / "ckpt"
    main(["convert", "--from-gguf", str(gguf_file), "--out", str(out), "--dtype", "int8"])
    capsys.readouterr()
    assert main(["sample", str(out), "--prompt", "ab", "--max-new-tokens", "2", "--dtype", "fp32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "int8" in err and "\n" not in err
    with pytest.raises(GptlabError, match="cannot be loaded as bf16"):
        gptlab.load(out, quantize="bf16")
    from gptlab.sources import load_source

    with pytest.raises(GptlabError, match="cannot be trained"):
        load_source(out)
    assert main(["convert", "--to-hf", str(out), "--out", str(tmp_path / "hf")]) == 2
    assert "cannot be exported" in capsys.readouterr().err
    bf16_quantized = gptlab.quantize(from_gguf(gguf_file), "bf16")
    with pytest.raises(GptlabError, match="cannot be saved"):
        gptlab.save(bf16_quantized, None, tmp_path / "bf16")


def test_a_float_checkpoint_is_converted_while_loading(gguf_file, tmp_path):
    out = tmp_path / "fp32"
    assert main(["convert", "--from-gguf", str(gguf_file), "--out", str(out)]) == 0
    float_model, _ = gptlab.load(out)
    for mode in ("int8", "bf16"):
        streamed, _ = gptlab.load(out, quantize=mode)
        reference = gptlab.quantize(copy.deepcopy(float_model), mode)
        torch.testing.assert_close(logits(streamed), logits(reference), rtol=0, atol=0)


# ------------------------------------------------------------------ BOS
@pytest.mark.parametrize("add_bos", [True, False])
def test_bos_is_added_exactly_where_the_file_says_as_transformers_does(tmp_path, add_bos):
    transformers = pytest.importorskip("transformers", reason="compares with transformers' GGUF tokenizer")
    path = tmp_path / "tiny.gguf"
    write_llama(path, tiny_llama(), add_bos=add_bos)
    ours = tokenizer_from_gguf(path)
    assert (ours.encode("ab")[:1] == [ours.bos_id]) is add_bos  # what the file says, on our own
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    if theirs.add_bos_token is not add_bos:  # seen with transformers 5.17 (5.23 reads the flag)
        pytest.skip(f"transformers {transformers.__version__} ignores the file's add_bos_token")
    for text in ("ab ab", " abab a", "", "b<|im_end|>a"):
        expected = theirs.encode(text)
        assert ours.encode(text, allowed_special="all") == expected, text
        assert (expected[:1] == [ours.bos_id]) is add_bos
    messages = [{"role": "user", "content": "ab"}]  # a chat template writes its own BOS: none is added
    rendered = theirs.apply_chat_template(messages, tokenize=False)  # what apply_chat_template encodes:
    assert encode_chat(ours, messages) == theirs.encode(rendered, add_special_tokens=False)  # no BOS added


def test_a_hugging_face_folder_says_whether_to_add_bos(tmp_path):
    from gptlab.tokenizers.hf_files import read_hf_tokenizer, write_hf_tokenizer

    path = tmp_path / "tiny.gguf"
    write_llama(path, tiny_llama())
    tok = tokenizer_from_gguf(path)
    write_hf_tokenizer(tok, tmp_path, model_max_length=64)
    config_file, tokenizer_file = tmp_path / "tokenizer_config.json", tmp_path / "tokenizer.json"
    config, data = json.loads(config_file.read_text()), json.loads(tokenizer_file.read_text())
    assert read_hf_tokenizer(tmp_path).encode("ab")[0] != tok.bos_id  # add_bos_token: false
    config["add_bos_token"] = True
    config_file.write_text(json.dumps(config))
    assert read_hf_tokenizer(tmp_path).encode("ab")[0] == tok.bos_id
    del config["add_bos_token"]  # no flag: Llama 3's post-processor template puts BOS first
    config_file.write_text(json.dumps(config))
    first = {"SpecialToken": {"id": tok.bos_token, "type_id": 0}}
    data["post_processor"] = {"type": "TemplateProcessing", "single": [first, {"Sequence": {"id": "A"}}]}
    tokenizer_file.write_text(json.dumps(data))
    assert read_hf_tokenizer(tmp_path).add_bos
    data["post_processor"] = None
    tokenizer_file.write_text(json.dumps(data))
    assert not read_hf_tokenizer(tmp_path).add_bos


def test_converting_while_loading_names_a_mismatched_checkpoint(gguf_file, tmp_path):
    out = tmp_path / "fp32"
    main(["convert", "--from-gguf", str(gguf_file), "--out", str(out)])
    config = json.loads((out / "config.json").read_text())
    config["model"]["d_ff"] += 8  # every feed-forward matrix now has the wrong shape
    (out / "config.json").write_text(json.dumps(config))
    write_checksums(out)  # a config edited on purpose: past the checksums, to the shape check
    with pytest.raises(GptlabError, match=r"model.safetensors: tensor blocks\.0\.mlp\.\w+\.weight has shape"):
        gptlab.load(out, quantize="int8")
    config["model"]["n_layer"] += 1
    (out / "config.json").write_text(json.dumps(config))
    write_checksums(out)
    with pytest.raises(GptlabError, match=r"missing: blocks\.2\."):
        gptlab.load(out, quantize="int8")


def test_an_f32_records_values_are_an_array_of_their_own(tmp_path):
    """``dequantize`` of an F32 record copies it out of the file's read-only mapping: ``torch.from_numpy``
    of the mapping warned ("The given NumPy array is not writable") when an F32 file loaded as int8 or
    int4, and a tensor written in place would have written to the file's pages."""
    from gptlab.interop.gguf import dequantize, read_gguf

    path = tmp_path / "f32.gguf"
    write_llama(path, tiny_llama(), Q.F32)
    f = read_gguf(path)
    for record in f.tensors:
        values = dequantize(record, path)
        assert values.flags.writeable and not np.shares_memory(values, record.data), record.name


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_an_f32_file_loads_quantized_without_a_warning(tmp_path, quantize):
    """In a process of its own (torch says it once a process): an F32 file as int8 or int4 weights."""
    path = tmp_path / "f32.gguf"
    write_llama(path, tiny_llama(), Q.F32)
    code = f"import gptlab; gptlab.load({str(path)!r}, quantize={quantize!r})"
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert run.returncode == 0 and "Warning" not in run.stderr, run.stderr[-2000:]
