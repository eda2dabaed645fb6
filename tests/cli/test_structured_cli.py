"""``gptlab sample --json-schema/--regex/--grammar`` and ``gptlab chat --json-schema``: the output
follows the file's schema or grammar; a bad one is one error line and status 2."""

from __future__ import annotations

import io
import json

import pytest

import gptlab
from gptlab.cli import main
from gptlab.tokenizers import CharTokenizer
from tests._structured import JSON_ALPHABET, SCHEMAS, validate


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_model):
    tok = CharTokenizer.from_text(JSON_ALPHABET, special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=128)
    return gptlab.save(model, tok, tmp_path_factory.mktemp("ckpt") / "c")


def _file(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_sample_json_schema_validates(ckpt, tmp_path, capsys):
    schema = _file(tmp_path, "s.json", json.dumps(SCHEMAS["nested"]))
    stopped = 0
    for seed in range(3):
        args = ["sample", str(ckpt), "--prompt", "go", "--json-schema", schema, "--max-new-tokens", "90"]
        assert main([*args, "--seed", str(seed), "--verbose"]) == 0
        out, err = capsys.readouterr()
        assert out.startswith("go") and "json_schema masks the tokens" in err  # the printed plan
        text = out[2:].rstrip("\n")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            assert len(text) == 90  # cut by --max-new-tokens (one token per character)
            continue
        validate(value, SCHEMAS["nested"])
        stopped += 1
    assert stopped >= 2


def test_json_schema_given_inline_is_the_file_s_schema(ckpt, tmp_path, capsys):
    """``--json-schema`` takes the schema itself, as llama.cpp's does, or a file: one seed, one text."""
    text = json.dumps(SCHEMAS["flat"])
    outs = []
    for schema in (_file(tmp_path, "s.json", text), text, "  " + text):
        assert main(["sample", str(ckpt), "--prompt", "go", "--json-schema", schema, "--seed", "4"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2] and outs[0].startswith("go")
    assert main(["sample", str(ckpt), "--prompt", "go", "--json-schema", '{"type": "object",']) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --json-schema: not JSON") and err.count("\n") == 1, err
    assert main(["sample", str(ckpt), "--prompt", "go", "--json-schema", str(tmp_path / "none.json")]) == 2
    assert "none.json: file not found" in capsys.readouterr().err


def test_sample_regex_and_grammar(ckpt, tmp_path, capsys):
    assert main(["sample", str(ckpt), "--prompt", "x", "--regex", "[0-9]{3}-[a-c]+!", "--seed", "1"]) == 0
    out = capsys.readouterr().out.rstrip("\n")[1:]
    digits, _, rest = out.partition("-")
    assert len(digits) == 3 and digits.isdigit() and rest.endswith("!") and set(rest[:-1]) <= set("abc")
    lark = _file(tmp_path, "g.lark", 'start: "yes" | "no"\n')
    assert main(["sample", str(ckpt), "--prompt", "x", "--grammar", lark, "--num-samples", "3"]) == 0
    samples = capsys.readouterr().out.rstrip("\n")[1:].split("\n" + "-" * 40 + "\n" + "x")
    assert len(samples) == 3 and set(samples) <= {"yes", "no"}


@pytest.mark.parametrize(
    ("option", "content", "message"),
    [
        ("--json-schema", '{"type": "nope"}', "could not be compiled: Invalid type: nope"),
        ("--json-schema", "{not json", "not JSON"),
        ("--grammar", "start: foo\n", "unknown name"),
        ("--regex", "a(b", "unclosed group"),
    ],
)
def test_what_cannot_be_compiled_is_one_error_line(ckpt, tmp_path, capsys, option, content, message):
    value = content if option == "--regex" else _file(tmp_path, "bad", content)
    assert main(["sample", str(ckpt), "--prompt", "x", option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err


def test_only_one_structure_option_and_not_with_beam_search(ckpt, tmp_path, capsys):
    schema = _file(tmp_path, "s.json", "{}")
    assert main(["sample", str(ckpt), "--json-schema", schema, "--regex", "a"]) == 2
    assert "not allowed with argument --json-schema" in capsys.readouterr().err
    assert main(["sample", str(ckpt), "--regex", "a+", "--beam-width", "2"]) == 2
    assert "beam search" in capsys.readouterr().err


def test_chat_json_schema_every_reply_is_json(ckpt, tmp_path, capsys, monkeypatch):
    schema = _file(tmp_path, "s.json", json.dumps(SCHEMAS["flat"]))
    monkeypatch.setattr("sys.stdin", io.StringIO("who are you\nand now\n/exit\n"))
    assert main(["chat", str(ckpt), "--json-schema", schema, "--max-new-tokens", "80", "--seed", "2"]) == 0
    replies = capsys.readouterr().out.strip().split("\n")
    assert len(replies) == 2
    for reply in replies:
        try:
            validate(json.loads(reply), SCHEMAS["flat"])
        except json.JSONDecodeError:
            assert len(reply) == 80
