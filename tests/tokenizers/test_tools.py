"""Tool calls in a chat (tokenizers/tools.py): the prompt with tools (a template that takes them, and
the generic prompt), reading calls back (whole and streamed), and the grammar of a call."""

from __future__ import annotations

import json
import random

import pytest

from gptlab.errors import GptlabError
from gptlab.tokenizers.chat import ChatTemplate
from gptlab.tokenizers.tools import (
    CLOSE,
    GENERIC_PROMPT,
    OPEN,
    TEXT_ONLY,
    CallStream,
    Tool,
    call_grammar,
    format_calls,
    message_problem,
    parse_calls,
    render_with_tools,
    takes_tools,
    tool_problem,
    turn_problem,
)
from tests._structured import matches

WEATHER = Tool(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 6},
            "unit": {"enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)
ADD = Tool(
    "add",
    "a + b",
    {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": -9, "maximum": 9}, "b": {"type": "boolean"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)
NAMES = {"get_weather", "add"}

#: a template that takes tools, in the style of Qwen2.5's / Hermes' (calls as <tool_call> JSON, arguments
#: an object, results as tool messages)
NATIVE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}{% endif %}{% if m.role == 'tool' %} (for {{ m.tool_call_id }}){% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CALLED = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


# ------------------------------------------------------------------ checking tools
def test_tool_problems_name_what_is_wrong():
    assert tool_problem([WEATHER, ADD]) is None
    assert tool_problem([Tool("bad name!")])[0] == "tools.0.function.name"
    assert tool_problem([Tool("x" * 65)])[0] == "tools.0.function.name"
    assert tool_problem([ADD, Tool("f", parameters={"type": "array"})])[0] == "tools.1.function.parameters"
    param, message = tool_problem([ADD, WEATHER, ADD])
    assert param == "tools.2.function.name" and "tools.0" in message


# ------------------------------------------------------------------ the prompt
def test_takes_tools_reads_the_template():
    assert takes_tools(NATIVE)
    assert not takes_tools(ChatTemplate.named("chatml").source)
    assert not takes_tools(
        "{% for m in messages %}{{ m.tools }}{% endfor %}"
    )  # an attribute, not the variable


def test_generic_prompt_is_merged_into_the_system_message():
    chatml = ChatTemplate.named("chatml")
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = render_with_tools(chatml, with_system, [WEATHER, ADD])
    assert prompt.count("<|im_start|>system") == 1
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\nYou are an expert in composing functions")
    listed = json.loads(system.split("<tools>")[1].split("</tools>")[0])
    assert listed == [WEATHER.signature(), ADD.signature()]
    alone = render_with_tools(chatml, with_system[1:], [WEATHER])
    assert alone.startswith("<|im_start|>system\nYou are an expert") and "<|im_start|>user\nHi" in alone
    assert render_with_tools(chatml, with_system, []) == chatml.render(with_system)  # no tools: as before
    assert GENERIC_PROMPT.count("{tools}") == 1


def test_generic_prompt_writes_earlier_calls_and_results():
    prompt = render_with_tools(ChatTemplate.named("chatml"), CALLED, [WEATHER])
    assert "<|im_start|>assistant\n" + format_calls([("get_weather", '{"city": "Paris"}')]) in prompt
    assert "<|im_start|>tool\nsunny, 21 C<|im_end|>" in prompt
    strict = ChatTemplate(  # a template that refuses the tool role: results come as user messages
        "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('bad role') }}{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    assert "user: <tool_response>\nsunny, 21 C\n</tool_response>" in render_with_tools(
        strict, CALLED, [WEATHER]
    )


def test_a_template_that_takes_tools_gets_them_its_own_way():
    template = ChatTemplate(NATIVE)
    prompt = render_with_tools(template, CALLED, [WEATHER])
    assert GENERIC_PROMPT[:20] not in prompt
    listed = prompt.split("<tools>")[1].split("</tools>")[0]
    assert json.loads(listed) == WEATHER.openai()
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "sunny, 21 C (for call_1)" in prompt


# ------------------------------------------------------------------ reading calls back
def test_parse_calls_reads_both_forms():
    one = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": true}}\n</tool_call>'
    listed = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "add", "arguments": {}}]'
    assert parse_calls("Let me see. " + one, NAMES) == ("Let me see.", [("add", '{"a": 1, "b": true}')])
    content, calls = parse_calls(one + "\n" + listed + CLOSE, NAMES)
    assert content == "" and [c[0] for c in calls] == ["add", "get_weather", "add"]
    assert parse_calls(listed, NAMES)[1][0] == (
        "get_weather",
        '{"city": "Oslo"}',
    )  # no closing tag at the end
    assert parse_calls('<tool_call>{"name": "add", "parameters": {"a": 2}}</tool_call>')[1] == [
        ("add", '{"a": 2}')
    ]
    assert parse_calls("No call is needed. <tool_call>[]</tool_call>", NAMES) == ("No call is needed.", [])
    for bad in (
        "no call here",
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',  # not offered
        '<tool_call>{"name": "add", "arguments": {"a": </tool_call>',  # cut JSON
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "add", "arguments": {}}</tool_call> and more text',
        '<tool_call>[{"name": "add", "argu',  # cut before any call is complete
        "<tool_cal",
    ):
        assert parse_calls(bad, NAMES) == (bad, []), bad


@pytest.mark.parametrize(
    "text",
    [
        'Sure.  <tool_call>[{"name": "add", "arguments": {"a": 1, "b": false}}]</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x<y"}}\n</tool_call>',
        "plain text with a < sign and <tool but no call  ",
        "text then a broken <tool_call>{nope",
        "ends on a prefix <tool_ca",
        "No call.\n<tool_call>[]</tool_call>",
        '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": false}}, {"name": "get_weather", "arguments": '
        '{"city": "Rome"}}]</tool_call>\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": true}}</tool_call>',
    ],
)
def test_streamed_split_adds_up_to_the_whole(text):
    whole_content, whole_calls = parse_calls(text, NAMES)
    rnd = random.Random(0)
    for _ in range(20):
        cuts = sorted(rnd.sample(range(1, len(text)), k=min(6, len(text) - 1)))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stream = CallStream(NAMES)
        sent, early = [], []
        for p in pieces:
            sent.append(stream.feed(p))
            early += stream.ready()  # each call once its JSON is complete
        for out, so_far in zip(sent, pieces, strict=True):
            assert OPEN not in out and not (out and out[-1:].isspace() and so_far)  # held back: spaces, tags
        rest, calls = stream.finish()
        assert early + calls == whole_calls
        assert "".join(sent) + rest == whole_content  # (the whole text where no call reads)


# ------------------------------------------------------------------ the grammar
def walk(grammar: str, seed: int, prefix: bytes = b"", steps: int = 2000) -> tuple[str, bool]:
    """A random walk through ``grammar`` over a byte vocabulary (each allowed printable byte equally
    likely, the end 60 % of the time where allowed): the text and whether the grammar accepts it."""
    llg = pytest.importorskip("llguidance")

    class Bytes:
        eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
        tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]

        def __call__(self, s: bytes) -> list[int]:
            return list(s)

    tok = llg.LLTokenizer(llg.TokenizerWrapper(Bytes()))
    matcher = llg.LLMatcher(tok, llg.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    rnd, out = random.Random(seed), bytearray(prefix)
    for b in prefix:
        assert matcher.consume_token(b), matcher.get_error()
    for _ in range(steps):
        mask = matcher.compute_logit_bias()
        allowed = [i for i in range(257) if mask[i]]
        printable = [i for i in allowed if 32 <= i < 127 or i in (10, 256)]  # keep the text readable
        token = 256 if 256 in allowed and rnd.random() < 0.6 else rnd.choice(printable or allowed)
        if token == 256 or matcher.is_stopped():
            break
        assert matcher.consume_token(token)
        out.append(token)
    return out.decode("utf-8", errors="replace"), matcher.is_accepting()


@pytest.mark.parametrize("parallel", [True, False])
def test_required_grammar_gives_calls_whose_arguments_validate(parallel):
    grammar = call_grammar([WEATHER, ADD], mode="required", parallel=parallel)
    schemas = {t.name: t.parameters for t in (WEATHER, ADD)}
    for seed in range(25):
        text, accepted = walk(grammar, seed)
        assert accepted, text
        content, calls = parse_calls(text, NAMES)
        assert content == "" and calls, text
        assert parallel or len(calls) == 1
        for name, arguments in calls:
            assert matches(schemas[name], json.loads(arguments)), (name, arguments)


def test_named_grammar_calls_only_that_function():
    grammar = call_grammar([WEATHER, ADD], mode="required", only="add")
    for seed in range(10):
        text, _ = walk(grammar, seed)
        assert {name for name, _ in parse_calls(text, NAMES)[1]} == {"add"}, text
    with pytest.raises(GptlabError, match="rm"):
        call_grammar([WEATHER], mode="required", only="rm")


def test_an_empty_list_means_no_call_under_auto_only():
    text, accepted = walk(call_grammar([ADD], mode="auto"), 0, b"None needed. <tool_call>[]")
    assert accepted and text == "None needed. <tool_call>[]</tool_call>"  # nothing may follow
    with pytest.raises(AssertionError):  # required: a call it must be
        walk(call_grammar([ADD], mode="required"), 0, b"<tool_call>[]")


def test_the_text_only_grammar_never_starts_a_call():
    """``gptlab chat``'s last round: any text, but not ``<tool_call>`` anywhere in it."""
    for seed in range(5):
        text, accepted = walk(TEXT_ONLY, seed, b"It is sunny. ", steps=60)
        assert accepted and OPEN not in text, text
    with pytest.raises(AssertionError):  # the last byte of the tag is refused
        walk(TEXT_ONLY, 0, b"Let me check. " + OPEN.encode())
    text, accepted = walk(TEXT_ONLY, 0, b"Let me check. " + OPEN.encode()[:-1])
    assert accepted and OPEN not in text


def test_auto_grammar_is_free_until_a_call_starts():
    grammar = call_grammar([WEATHER, ADD], mode="auto")
    free = [walk(grammar, seed, b"The answer is ", steps=40) for seed in range(5)]
    assert all(accepted and OPEN not in text for text, accepted in free)  # free text, ending anywhere
    called = 0
    for seed in range(10):
        text, accepted = walk(grammar, seed, b"Let me check. " + OPEN.encode())
        content, calls = parse_calls(text, NAMES)
        assert accepted and content == "Let me check.", text
        assert calls or text.endswith(OPEN + "[]" + CLOSE), text  # a call, or "none is needed"
        called += bool(calls)
        assert all(
            matches({"get_weather": WEATHER, "add": ADD}[n].parameters, json.loads(a)) for n, a in calls
        )
    assert called >= 5


# ------------------------------------------------------------------ the order of calls and results
def _call(i: str) -> dict:
    return {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}


USER = {"role": "user", "content": "hi"}
CALLS = {"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]}


def _result(i: str | None) -> dict:
    return {"role": "tool", "content": "ok", **({"tool_call_id": i} if i is not None else {})}


@pytest.mark.parametrize(
    "messages",
    [
        [USER],
        [USER, CALLS, _result("a"), _result("b")],
        [USER, CALLS, _result("b"), _result("a"), {"role": "assistant", "content": "done"}, USER],
        [USER, CALLS, _result("a"), _result("b"), CALLS, _result("b"), _result("a")],  # ids reused later
    ],
)
def test_calls_each_answered_in_turn_are_in_order(messages):
    assert turn_problem(messages) is None


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        ([USER, CALLS, _result(None), _result("b")], "messages.2.tool_call_id", "has no tool_call_id"),
        ([{**USER, "tool_calls": [_call("a")]}], "messages.0.tool_calls", "only an assistant's"),
        ([{**USER, "tool_calls": []}], "messages.0.tool_calls", "only an assistant's"),
    ],
)
def test_a_message_wrong_on_its_own_is_named(messages, param, words):
    """What the server's schema states of each message (a 400): a tool message names its call, and
    only an assistant's message holds calls."""
    problem = message_problem(messages)
    assert problem is not None and problem[0] == param and words in problem[1], problem
    assert message_problem([USER, CALLS, _result("a"), _result("b")]) is None


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        ([USER, _result("a")], "messages.1", "must answer a call"),
        ([USER, CALLS, _result("a"), _result("c")], "messages.3.tool_call_id", "'c' is not the id of a call"),
        ([USER, CALLS, _result("a"), _result("a")], "messages.3.tool_call_id", "answered that call already"),
        ([USER, CALLS, _result("a"), USER], "messages.1.tool_calls", "no tool message answers the call 'b'"),
        ([USER, CALLS], "messages.1.tool_calls", "the calls 'a', 'b'"),
        ([USER, CALLS, USER, _result("a")], "messages.1.tool_calls", "calls 'a', 'b'"),
        (
            [USER, {**CALLS, "tool_calls": [_call("a"), _call("a")]}, _result("a")],
            "messages.1.tool_calls.1.id",
            "also the id of tool_calls.0",
        ),
    ],
)
def test_calls_and_results_out_of_order_are_named(messages, param, words):
    """As OpenAI's API refuses them: a result with no call before it, a call left unanswered, an id
    that is no call's or is answered twice, two calls of one id."""
    problem = turn_problem(messages)
    assert problem is not None and problem[0] == param and words in problem[1], problem
