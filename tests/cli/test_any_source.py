"""Every command that takes a model takes every source: a checkpoint, a run directory, a Hugging Face
folder and a GGUF file of one tiny model give the same greedy text, chat reply, loss, trace and
checkpoint; a source that is none of them is the same one ``error:`` line (status 2) everywhere."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package writes GGUF files")

import gptlab  # noqa: E402
from gptlab.cli import main  # noqa: E402
from gptlab.interop.gguf_export import to_gguf  # noqa: E402
from gptlab.interop.hf import to_hf  # noqa: E402
from gptlab.sources import load, source_kind  # noqa: E402
from gptlab.tokenizers import BPETokenizer  # noqa: E402
from gptlab.tokenizers.hf_files import write_hf_tokenizer  # noqa: E402
from tests._tiny import TINY_TRAIN, tiny_model  # noqa: E402

TEXT = "hello world, the quick brown fox jumps over the lazy dog.\nHELLO again! 123 456 "
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
KINDS = ["checkpoint", "run", "hf", "gguf"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """One tiny Llama-shaped model (RoPE, RMSNorm, SwiGLU, GQA) with a BPE tokenizer and a chat template,
    written as each kind of source: a checkpoint, a run directory, a Hugging Face folder, a GGUF file."""
    root = tmp_path_factory.mktemp("sources")
    tok = BPETokenizer.train(TEXT * 4, vocab_size=300, pattern="gpt2", special_tokens=SPECIALS)
    tok.chat_template = TEMPLATE
    options = dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_head=2, block_size=64)
    model = tiny_model(jitter=0.05, vocab_size=tok.vocab_size, n_embd=64, **options)
    found = {"checkpoint": gptlab.save(model, tok, root / "ckpt")}
    shutil.copytree(found["checkpoint"], root / "run" / "ckpt-3")
    found["run"] = root / "run"
    to_hf(model, root / "hf", tok)
    write_hf_tokenizer(tok, root / "hf", model_max_length=model.config.block_size)
    found["hf"] = root / "hf"
    found["gguf"] = to_gguf(model, root / "m.gguf", tok)
    return found


def _run(capsys, *argv) -> tuple[str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def test_each_kind_is_recognised(sources):
    kinds = {kind: source_kind(path) for kind, path in sources.items()}
    assert kinds == {"checkpoint": "gptlab", "run": "gptlab", "hf": "hf", "gguf": "gguf"}


@pytest.mark.parametrize("quantize", ["fp32", "bf16", "int8"])
def test_load_gives_one_model_from_every_source(sources, quantize):
    """``gptlab.load`` of each kind in each inference format: the same logits (to the format's rounding)."""
    ids = torch.tensor([[5, 70, 130, 260, 9, 33]])
    logits = {}
    for kind, path in sources.items():
        model, tok = load(path, quantize=quantize)
        assert model.quantization == quantize and not model.training
        assert tok is not None and tok.chat_template == TEMPLATE
        with torch.no_grad():
            logits[kind] = model(ids).float()
    tol = {"fp32": 1e-5, "bf16": 2e-2, "int8": 2e-2}[quantize]
    for kind in KINDS[1:]:
        torch.testing.assert_close(logits[kind], logits["checkpoint"], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["fp32", "auto"])
def test_sample_from_every_source_gives_the_same_greedy_text(sources, capsys, dtype):
    outs = {}
    for kind, path in sources.items():
        args = ["--prompt", "hello", "--max-new-tokens", "8", "--temperature", "0", "--dtype", dtype]
        outs[kind], _ = _run(capsys, "sample", path, *args, "--device", "cpu")
    assert outs["checkpoint"].startswith("hello")
    assert all(out == outs["checkpoint"] for out in outs.values()), outs


def test_chat_from_every_source_uses_its_template_and_gives_the_same_reply(sources, capsys, monkeypatch):
    replies = {}
    for kind, path in sources.items():
        monkeypatch.setattr("sys.stdin", io.StringIO("hello world\n/exit\n"))
        replies[kind], _ = _run(capsys, "chat", path, "--max-new-tokens", "6", "--device", "cpu")
    model, tok = load(sources["checkpoint"])
    prompt = TEMPLATE.replace("{% if add_generation_prompt %}", "")  # the template is used: check by hand
    assert "<|im_start|>" in prompt
    config = gptlab.SampleConfig(
        max_new_tokens=6, temperature=0, stop_tokens=[tok.special_tokens["<|im_end|>"]]
    )
    rendered = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    expected = gptlab.generate_text(model, tok, rendered, config)
    assert replies["checkpoint"].strip() == expected.strip()
    assert all(reply == replies["checkpoint"] for reply in replies.values()), replies


def test_eval_trace_and_attention_take_every_source(sources, capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 2, encoding="utf-8")
    losses, tops = {}, {}
    for kind, path in sources.items():
        out, _ = _run(capsys, "eval", path, "--text", text, "--dtype", "float32", "--json", "--no-progress")
        losses[kind] = json.loads(out)["loss"]
        out, _ = _run(capsys, "trace", path, "hello world", "--json", "--device", "cpu")
        tops[kind] = [t["id"] for t in json.loads(out)["next_tokens"]]
    for kind in KINDS[1:]:
        assert losses[kind] == pytest.approx(losses["checkpoint"], rel=1e-5)
        assert tops[kind] == tops["checkpoint"]
    out, _ = _run(capsys, "attention", sources["gguf"], "hello world", "-o", tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 0 and "layers" in out


def test_size_reads_every_source_without_its_weights(sources, capsys):
    """``gptlab size`` of each kind: the same counts and costs as the checkpoint's config gives."""
    reports = {}
    for kind, path in sources.items():
        out, _ = _run(capsys, "size", path, "--json", "--context", "32")
        report = json.loads(out)  # (its title names the source, and config's "extra" where it came from)
        reports[kind] = {
            k: report[k] for k in ("symbols", "parameters", "compute", "kv_cache", "training_memory")
        }
    assert reports["checkpoint"]["parameters"][-1]["value"] > 0
    for kind in KINDS[1:]:
        assert reports[kind] == reports["checkpoint"], kind


def test_the_tokenizer_commands_read_every_source(sources, capsys):
    """``gptlab tokenizer encode|decode|show --tokenizer MODEL``: the tokenizer the model carries, as
    ``gptlab prepare --tokenizer MODEL`` reads it (it answered "tokenizer file … does not exist")."""
    from gptlab.sources import source_tokenizer

    expected = source_tokenizer(sources["checkpoint"]).encode(TEXT)
    for kind, path in sources.items():
        out, _ = _run(capsys, "tokenizer", "encode", "--tokenizer", path, "--text", TEXT)
        assert [int(i) for i in out.split()] == expected, kind
        out, _ = _run(capsys, "tokenizer", "decode", "--tokenizer", path, *expected)
        assert out == TEXT, kind
        out, _ = _run(capsys, "tokenizer", "show", "--tokenizer", path, "--limit", "3")
        assert "vocab_size 300" in out.splitlines()[0], kind


def test_fill_reads_every_source_and_refuses_a_decoder_for_what_it_is(sources, capsys):
    """fill opens the source, then says the model is no masked-language encoder (not that the path is bad)."""
    for path in sources.values():
        assert main(["fill", str(path), "hello [MASK]"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "no such" not in err and "not a gptlab" not in err


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_convert_from_any_source_writes_a_checkpoint_of_the_same_model(sources, capsys, tmp_path, dtype):
    ids = torch.tensor([[5, 70, 130, 260]])
    reference, _ = load(sources["checkpoint"], quantize=dtype)
    for kind, path in sources.items():
        out, _ = _run(capsys, "convert", "--from", path, "--out", tmp_path / kind, "--dtype", dtype)
        assert "wrote gptlab checkpoint" in out
        model, tok = load(tmp_path / kind)
        assert tok is not None and tok.chat_template == TEMPLATE
        assert getattr(model, "quantization", None) == (dtype if dtype == "int8" else None)
        with torch.no_grad():
            torch.testing.assert_close(model(ids), reference(ids), rtol=1e-4, atol=1e-4)


def test_serve_loads_every_source_with_its_tokenizer(sources):
    """What ``gptlab serve`` loads (``load_for_serving``) answers a chat request from a GGUF file."""
    from fastapi.testclient import TestClient

    from gptlab.serve import create_app
    from gptlab.serve.launch import load_for_serving, model_name

    assert model_name(str(sources["gguf"])) == "m" and model_name("smollm2") == "smollm2"
    for path in sources.values():
        model, tok = load_for_serving(str(path), "fp32")
        assert tok.chat_template == TEMPLATE
    app = create_app(model, tok, model_name="m", max_batch=2)
    with TestClient(app) as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    "argv",
    [
        ["sample", "{}", "--prompt", "x"],
        ["chat", "{}"],
        ["serve", "{}", "--port", "0"],
        ["eval", "{}", "--text", "{}"],
        ["trace", "{}", "x"],
        ["attention", "{}", "x", "-o", "{}.png"],
        ["fill", "{}", "x [MASK]"],
        ["size", "{}"],
        ["quantize", "{}", "--to", "int8", "--out", "{}.out"],
        ["compile", "{}", "--compile-cache", "{}.cache"],
        ["convert", "--from", "{}", "--out", "{}.out"],
        ["convert", "--to-hf", "{}", "--out", "{}.out"],
        ["convert", "--to-gguf", "{}", "--out", "{}.gguf"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
@pytest.mark.parametrize("bad", ["missing", "not-a-model"])
def test_a_bad_source_is_the_same_one_line_everywhere(argv, bad, tmp_path, capsys):
    path = tmp_path / bad
    if bad == "not-a-model":
        path.mkdir()
        (path / "notes.txt").write_text("x", encoding="utf-8")
    assert main([a.replace("{}", str(path)) for a in argv]) == 2
    err = capsys.readouterr().err
    expected = {
        "missing": f"error: {path}: no such checkpoint, run directory, Hugging Face folder or GGUF file",
        "not-a-model": f"error: {path}: not a gptlab checkpoint or run directory, a Hugging Face folder",
    }[bad]
    assert err.startswith(expected) and err.count("\n") == 1, err


def test_train_init_names_a_bad_source_the_same_way(dataset, tmp_path, capsys):
    missing = tmp_path / "missing"
    argv = [
        "train",
        "--data",
        str(dataset),
        "--out",
        str(tmp_path / "run"),
        *TINY_TRAIN,
        "--init",
        str(missing),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{missing}: no such checkpoint, run directory, Hugging Face folder or GGUF file" in err


@pytest.mark.slow
def test_smollm2_by_its_short_name_samples_as_its_converted_checkpoint(capsys, tmp_path):
    """The packaged GGUF file runs as llama.cpp users run it, and says what a checkpoint of it says."""
    from gptlab.errors import GptlabError
    from gptlab.interop.gguf import resolve

    try:
        resolve("smollm2")
    except GptlabError as exc:
        pytest.skip(str(exc))
    args = ["--prompt", "The capital of France is", "--max-new-tokens", "8", "--temperature", "0"]
    direct, _ = _run(capsys, "sample", "smollm2", *args)
    _run(capsys, "convert", "--from", "smollm2", "--out", tmp_path / "ckpt")
    converted, _ = _run(capsys, "sample", tmp_path / "ckpt", *args)
    assert direct == converted and "Paris" in direct
