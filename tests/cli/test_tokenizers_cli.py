"""``gptlab tokenizer train|encode|decode|show``: results on stdout, bad input as one ``error:`` line."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from gptlab.cli import main
from gptlab.tokenizers import EOT, load

CORPUS = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


@pytest.fixture
def trained(tmp_path, corpus):
    out = tmp_path / "tok.json"
    assert main(["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", str(out), "--quiet"]) == 0
    return out


def run(argv, stdin: str = "", monkeypatch=None):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8"))))
    return main(argv)


def test_train_writes_a_loadable_tokenizer(trained, capsys):
    tok = load(trained)
    assert tok.kind == "bpe" and tok.vocab_size == 300 and tok.eot_id == 299
    assert json.loads(trained.read_text())["pattern"] == "gpt4"


def test_encode_then_decode_round_trips(trained, capsys, monkeypatch):
    text = f"hear me speak{EOT} ü"
    assert run(["tokenizer", "encode", "--tokenizer", str(trained)], text, monkeypatch) == 0
    plain = capsys.readouterr().out
    ids = [int(x) for x in plain.split()]
    assert 299 not in ids  # special-token text is plain text unless --allow-special
    assert (
        run(["tokenizer", "encode", "--tokenizer", str(trained), "--allow-special"], text, monkeypatch) == 0
    )
    assert 299 in [int(x) for x in capsys.readouterr().out.split()]
    assert run(["tokenizer", "decode", "--tokenizer", str(trained)], plain, monkeypatch) == 0
    assert capsys.readouterr().out == text


def test_gpt2_folder_works_as_a_tokenizer(gpt2_files, capsys):
    folder = str(gpt2_files[0].parent)
    assert main(["tokenizer", "encode", "--tokenizer", folder, "--text", "Hello world"]) == 0
    assert capsys.readouterr().out.split() == ["15496", "995"]
    assert main(["tokenizer", "decode", "--tokenizer", folder, "464", "3797", "3332", "319"]) == 0
    assert capsys.readouterr().out == "The cat sat on"


def test_show_lists_tokens_with_escapes(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a\tb\nc", encoding="utf-8")
    out = tmp_path / "char.json"
    assert main(["tokenizer", "train", str(corpus), "--kind", "char", "--out", str(out)]) == 0
    assert main(["tokenizer", "show", "--tokenizer", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == ["0\t\\t", "1\t\\n", "2\ta", "3\tb", "4\tc", f"5\t{EOT}\t(special)"]


BAD = {
    "non-UTF-8 corpus": (["train", "{bad}", "--vocab-size", "300", "--out", "{tmp}/x.json"], "not UTF-8"),
    "empty corpus": (["train", "{empty}", "--vocab-size", "300", "--out", "{tmp}/x.json"], "empty"),
    "vocab too small": (
        ["train", "{corpus}", "--vocab-size", "200", "--out", "{tmp}/x.json"],
        "vocab_size >= 257",
    ),
    "missing vocab size": (["train", "{corpus}", "--out", "{tmp}/x.json"], "--vocab-size is required"),
    "missing corpus": (
        ["train", "{tmp}/none.txt", "--vocab-size", "300", "--out", "{tmp}/x.json"],
        "does not exist",
    ),
    "corrupt tokenizer": (["encode", "--tokenizer", "{corrupt}", "--text", "hi"], "corrupt"),
    "missing tokenizer": (["show", "--tokenizer", "{tmp}/nope.json"], "does not exist"),
    "bad id": (["decode", "--tokenizer", "{trained}", "12", "99999"], "99999"),
    "not an id": (["decode", "--tokenizer", "{trained}", "12", "x1"], "not a token id"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_one_error_line_and_status_2(name, tmp_path, corpus, trained, capsys):
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "corrupt.json").write_text('{"kind": "bpe", "version": 1, "merges": [[1')
    paths = {"tmp": tmp_path, "bad": tmp_path / "bad.txt", "empty": tmp_path / "empty.txt", "corpus": corpus}
    paths |= {"corrupt": tmp_path / "corrupt.json", "trained": trained}
    argv, message = BAD[name]
    capsys.readouterr()
    assert main(["tokenizer", *(a.format(**paths) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


def test_subprocess_error_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gptlab",
            "tokenizer",
            "train",
            str(bad),
            "--vocab-size",
            "300",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "bad.txt" in result.stderr and "offset 0" in result.stderr
