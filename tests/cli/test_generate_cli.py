"""``gptlab sample``: streams a continuation, reports tokens/s, and bad input is one error line."""

from __future__ import annotations

import pytest

import gptlab
from gptlab.cli import main
from gptlab.tokenizers import CharTokenizer


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_model):
    tok = CharTokenizer.from_text("abcdefgh ij\n", special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, pos="rope")
    return gptlab.save(model, tok, tmp_path_factory.mktemp("ckpt") / "c")


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_sample_streams_the_prompt_and_continuation(ckpt, capsys, dtype):
    args = [str(ckpt), "--prompt", "abc", "--max-new-tokens", "7", "--temperature", "0", "--dtype", dtype]
    assert main(["sample", *args]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("abc") and len(out.rstrip("\n")) <= 3 + 7
    assert "tokens/s" in err
    if dtype == "fp32":
        model, tok = gptlab.load(ckpt)
        expected = gptlab.generate_text(
            model, tok, "abc", gptlab.SampleConfig(max_new_tokens=7, temperature=0)
        )
        assert out == "abc" + expected + "\n"


def test_sample_compile_gives_the_same_greedy_text(ckpt, capsys):
    args = [str(ckpt), "--prompt", "abc", "--max-new-tokens", "12", "--temperature", "0", "--device", "cpu"]
    assert main(["sample", *args]) == 0
    layered = capsys.readouterr().out
    assert main(["sample", *args, "--compile", "on"]) == 0  # each decode step one compiled graph
    captured = capsys.readouterr()
    assert captured.out == layered  # whether the tokens came from the eager or the compiled step
    assert "compile: on" in captured.err
    assert "one-row step ran: " in captured.err  # which step decoded how many tokens


def test_sample_compile_auto_skips_a_small_model_and_says_why(ckpt, capsys):
    args = [str(ckpt), "--prompt", "abc", "--max-new-tokens", "5", "--temperature", "0", "--device", "cpu"]
    assert main(["sample", *args]) == 0  # --compile auto is the default
    err = capsys.readouterr().err
    assert "compile: off (a small model" in err


def test_num_samples_and_seed_reproduce(ckpt, tmp_path, capsys):
    prompt = tmp_path / "p.txt"
    prompt.write_text("ab", encoding="utf-8")
    args = [
        "sample",
        str(ckpt),
        "--prompt-file",
        str(prompt),
        "--num-samples",
        "2",
        "--seed",
        "3",
        "--max-new-tokens",
        "10",
        "--top-k",
        "5",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first and first.count("-" * 40) == 1


@pytest.mark.parametrize(
    "bad",
    [
        ["--top-p", "2"],
        ["--num-samples", "0"],
        ["--prompt", "xyz"],
        ["--prompt-file", "/no/such/file"],
        ["--beam-width", "2", "--top-k", "3"],
    ],
)
def test_bad_input_is_one_error_line_and_status_2(ckpt, capsys, bad):
    assert main(["sample", str(ckpt), *bad]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1
