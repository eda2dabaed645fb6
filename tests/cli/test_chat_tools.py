"""``gptlab chat --tools FILE.py``: the file's functions offered as tools, a call run, its result fed
back as a tool message; and the rule that turns a Python function into a tool's JSON Schema."""

from __future__ import annotations

import io
import json
import string
from typing import Literal

import pytest

import gptlab
from gptlab.cli import main
from gptlab.errors import GptlabError
from gptlab.tokenizers import CharTokenizer
from gptlab.tokenizers.tools import tool_from_function
from tests._tiny import tiny_model

TOOL_FILE = '''
import json
from pathlib import Path
from typing import Literal

LOG = Path(__file__).with_suffix(".log")


def paint(color: Literal["red", "green"], twice: bool = False) -> str:
    """Paint the wall.

    Args:
        color: the paint's color
    """
    with LOG.open("a") as f:
        f.write(json.dumps({"color": color, "twice": twice}) + "\\n")
    return f"painted {color}"


def _helper(x: int) -> int:  # private: not offered
    return x
'''


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    printable = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
    tok = CharTokenizer.from_text(printable, special_tokens=["<|im_start|>", "<|im_end|>"])  # chatml
    model = tiny_model(vocab_size=tok.vocab_size, block_size=2048, n_layer=1, n_head=2, pos="rope")
    return gptlab.save(model, tok, tmp_path_factory.mktemp("chat-tools") / "ckpt")


def test_tool_from_function_follows_the_documented_rule():
    def forecast(
        city: str,
        days: int,
        unit: Literal["c", "f"] = "c",
        hours: list[int] | None = None,
        detail: float = 1.0,
    ) -> str:
        """The forecast for a city,
        some days ahead.

        Args:
            city: the city's name
            days (int): how many days ahead

        Returns the forecast as text.
        """
        return ""

    tool = tool_from_function(forecast)
    assert tool.name == "forecast" and tool.description == "The forecast for a city, some days ahead."
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city's name"},
            "days": {"type": "integer", "description": "how many days ahead"},
            "unit": {"enum": ["c", "f"]},
            "hours": {"type": "array", "items": {"type": "integer"}},
            "detail": {"type": "number"},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    }

    def untyped(x):  # noqa: ANN001 - the point of the test
        return x

    with pytest.raises(GptlabError, match=r"untyped\(x\): give the parameter a type hint"):
        tool_from_function(untyped)

    def odd(x: complex) -> None:
        return None

    with pytest.raises(GptlabError, match="no JSON Schema"):
        tool_from_function(odd)


def test_chat_calls_a_tool_and_feeds_the_result_back(ckpt, tmp_path, monkeypatch, capsys):
    from gptlab.tokenizers import tools

    tool_file = tmp_path / "mytools.py"
    tool_file.write_text(TOOL_FILE)
    prompts = []
    real = tools.render_with_tools

    def spy(template, messages, offered=()):
        prompts.append(([dict(m) for m in messages], [t.name for t in offered]))
        return real(template, messages, offered)

    monkeypatch.setattr(tools, "render_with_tools", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("paint the wall\n/exit\n"))
    args = ["--tools", str(tool_file), "--tool-choice", "required", "--temperature", "1", "--seed", "3"]
    assert main(["chat", str(ckpt), "--max-new-tokens", "80", *args]) == 0
    out = capsys.readouterr().out
    (logged,) = [json.loads(line) for line in tool_file.with_suffix(".log").read_text().splitlines()]
    assert logged["color"] in ("red", "green")  # the function ran, with arguments of its schema
    assert f"→ painted {logged['color']}]" in out
    assert prompts[0][1] == ["paint"]  # _helper is private: not offered
    second = prompts[1][0]  # the model answers with the call and its result in the history
    assert second[1]["role"] == "assistant" and second[1]["tool_calls"][0]["function"]["name"] == "paint"
    assert second[2] == {
        "role": "tool",
        "tool_call_id": second[1]["tool_calls"][0]["id"],
        "name": "paint",
        "content": f"painted {logged['color']}",
    }


def test_the_last_round_answers_in_text(ckpt, tmp_path, monkeypatch, capsys):
    """After ``TOOL_ROUNDS`` rounds of calls the model answers under a grammar without calls
    (``TEXT_ONLY``): left free, SmolLM2 wrote one more ``<tool_call>`` as its answer."""
    from gptlab import generate
    from gptlab.cli import chat
    from gptlab.tokenizers.tools import OPEN, TEXT_ONLY

    tool_file = tmp_path / "mytools.py"
    tool_file.write_text(TOOL_FILE)
    grammars = []
    real = generate.stream_events

    def spy(model, tokenizer, prompt, config, **kw):
        grammars.append(config.grammar)
        return real(model, tokenizer, prompt, config, **kw)

    monkeypatch.setattr(chat, "TOOL_ROUNDS", 1)
    monkeypatch.setattr(generate, "stream_events", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("paint the wall\n/exit\n"))
    args = ["--tools", str(tool_file), "--tool-choice", "required", "--temperature", "1", "--seed", "3"]
    assert main(["chat", str(ckpt), "--max-new-tokens", "80", *args]) == 0
    out = capsys.readouterr().out
    assert len(grammars) == 2 and OPEN in grammars[0] and grammars[1] == TEXT_ONLY
    assert OPEN not in out.split("→ painted")[-1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "is not a file"),
        ("x = 1\n", "defines no public function"),
        ("raise ValueError('no')\n", "failed"),
    ],
)
def test_chat_tools_errors(ckpt, tmp_path, monkeypatch, capsys, text, message):
    path = tmp_path / "t.py"
    if text is not None:
        path.write_text(text)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["chat", str(ckpt), "--tools", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tools") and message in err


def test_chat_tools_and_a_json_schema_exclude_each_other(ckpt, tmp_path, monkeypatch, capsys):
    (tmp_path / "t.py").write_text(TOOL_FILE)
    (tmp_path / "s.json").write_text('{"type": "object"}')
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert (
        main(
            ["chat", str(ckpt), "--tools", str(tmp_path / "t.py"), "--json-schema", str(tmp_path / "s.json")]
        )
        == 2
    )
    assert "cannot both" in capsys.readouterr().err
