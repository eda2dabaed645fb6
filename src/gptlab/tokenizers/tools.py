"""Tool calls in a chat: how offered tools reach the prompt, how calls are read back, and the grammar of a call.

**Prompt.** A chat template that names ``tools`` (Qwen2.5's, Hermes', SmolLM3's …) is rendered as
transformers' ``apply_chat_template(messages, tools=...)`` renders it: ``tools`` is the list of OpenAI
tool objects (``{"type": "function", "function": {"name", "description", "parameters"}}``), an
assistant message carries ``tool_calls`` with ``arguments`` as an object, a ``tool`` message carries
``tool_call_id`` and its ``content``. Any other template gets the generic prompt: ``GENERIC_PROMPT``
(the function-calling prompt SmolLM2-Instruct was tuned with, from the APIGen data) with the
functions as JSON inside ``<tools></tools>``, merged into the system message (after its text, or as
a new system message); earlier calls are written back as the model writes them (``format_calls``),
and tool results go in as ``tool`` messages (``user`` messages in ``<tool_response>`` tags where the
template refuses the role).

**Calls.** A call is ``{"name": ..., "arguments": {...}}`` inside ``<tool_call>…</tool_call>``; a
block holds one call (Hermes/Qwen) or a JSON list of calls (SmolLM2): ``parse_calls`` reads both,
and ``CallStream`` splits a streamed reply into its text and its calls.

**Grammar.** ``call_grammar`` writes the Lark grammar (llguidance's syntax: ``%json{...}`` rules
for the arguments, ``lazy`` for the text before a call) that makes the model's calls well formed:
under ``"required"`` (or one named function) a call from the first token, under ``"auto"`` free
text that, once it writes ``<tool_call>``, must go on as a call.

    >>> parse_calls('<tool_call>[{"name": "f", "arguments": {"x": 1}}]</tool_call>', {"f"})
    ('', [('f', '{"x": 1}')])
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from gptlab.errors import GptlabError
from gptlab.tokenizers.json_writing import LAYOUT, as_written

if TYPE_CHECKING:
    from gptlab.tokenizers.chat import ChatTemplate

OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: OpenAI's rule for a function's name
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
#: an empty object schema: a function without ``parameters`` takes no arguments
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

#: The generic tool prompt, merged into the system message where the chat template takes no tools
#: (``{tools}``: the functions as a JSON list). SmolLM2-Instruct was tuned on it.
GENERIC_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions.\n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out and refuse to answer.\n"
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. If no function call "
    "is needed, please make the tool calls an empty list '[]'.\n"
    '<tool_call>[\n{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},\n'
    "... (more tool calls as required)\n]</tool_call>"
)


@dataclass(frozen=True)
class Tool:
    """One function offered to the model (OpenAI's ``tools[i].function``)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(NO_PARAMETERS))
    strict: bool = False

    def openai(self) -> dict[str, Any]:
        """OpenAI's tool object, as chat templates receive it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}

    def signature(self) -> dict[str, Any]:
        """What the generic prompt lists: name, description, parameters."""
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


def tool_problem(tools: Sequence[Tool]) -> tuple[str, str] | None:
    """The first thing wrong with ``tools`` as ``(param, message)``, or None: a bad name, parameters
    that are not an object schema, two functions of one name."""
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools):
        where = f"tools.{i}.function"
        if not re.fullmatch(NAME_PATTERN, tool.name):
            return f"{where}.name", (
                f"{where}.name {tool.name!r} must be 1 to 64 letters, digits, underscores or dashes"
            )
        if not isinstance(tool.parameters, Mapping) or tool.parameters.get("type") != "object":
            return f"{where}.parameters", (
                f'{where}.parameters must be a JSON Schema of an object ({{"type": "object", '
                f'"properties": {{...}}}}), got {json.dumps(tool.parameters)[:200]}'
            )
        if tool.name in seen:
            return f"{where}.name", f"{where}.name {tool.name!r} is also the name of tools.{seen[tool.name]}"
        seen[tool.name] = i
    return None


def message_problem(messages: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """The first message that is wrong on its own as ``(param, message)``, or None: a ``tool`` message
    names the call it answers (``tool_call_id``); only an assistant message holds ``tool_calls``
    (what the server's schema states of each message)."""
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool" and m.get("tool_call_id") is None:
            return f"messages.{i}.tool_call_id", (
                f"messages.{i} (role 'tool') has no tool_call_id: give the id of the call it answers"
            )
        if m.get("tool_calls") is not None and role != "assistant":
            return (
                f"messages.{i}.tool_calls",
                f"messages.{i}: a {role} message holds tool_calls; only an assistant's does",
            )
    return None


def turn_problem(messages: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """The first call or result out of the order OpenAI's API holds a chat to, as ``(param, message)``,
    or None (each message itself right, ``message_problem``): a call's id is unique in its message; a
    ``tool`` message follows the assistant message that made the call it answers, or another ``tool``
    message answering it; every call is answered, once, before the next message of another role (or
    the end of the chat)."""
    open_calls: dict[str, int] = {}  # the last calls' ids → their index in tool_calls
    answered: dict[str, int] = {}  # id → the message that answered it
    caller = -1  # the assistant message whose calls the tool messages now answer
    for i, m in enumerate([*messages, {"role": "end"}]):
        role = m.get("role")
        if role != "tool" and caller >= 0:
            missing = [c for c in open_calls if c not in answered]
            if missing:
                return f"messages.{caller}.tool_calls", (
                    f"messages.{caller}.tool_calls: no tool message answers the call"
                    f"{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}; each call is "
                    "answered by a role 'tool' message with its tool_call_id, right after the call"
                )
            caller, open_calls, answered = -1, {}, {}
        calls = m.get("tool_calls") or []
        for j, call in enumerate(calls):
            if call["id"] in open_calls:
                return f"messages.{i}.tool_calls.{j}.id", (
                    f"messages.{i}.tool_calls.{j}.id {call['id']!r} is also the id of tool_calls.{open_calls[call['id']]}"
                )
            open_calls[call["id"]] = j
        if calls:
            caller = i
        if role != "tool":
            continue
        call_id = m.get("tool_call_id")
        if caller < 0:
            return f"messages.{i}", (
                f"messages.{i}: a role 'tool' message must answer a call of the assistant message before "
                "it (an assistant message with tool_calls, then one tool message for each call)"
            )
        if call_id not in open_calls:
            return f"messages.{i}.tool_call_id", (
                f"messages.{i}.tool_call_id {call_id!r} is not the id of a call in messages.{caller}.tool_calls "
                f"({', '.join(map(repr, open_calls))})"
            )
        if call_id in answered:
            return f"messages.{i}.tool_call_id", (
                f"messages.{i}.tool_call_id {call_id!r}: messages.{answered[call_id]} answered that call already"
            )
        answered[call_id] = i
    return None


# ------------------------------------------------------------------ a Python function as a tool
#: Python type → JSON Schema, for ``tool_from_function``
PY_TYPES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    list: {"type": "array"},
    dict: {"type": "object"},
}


def _schema_of(hint: Any, where: str) -> tuple[dict[str, Any], bool]:
    """``(JSON Schema, optional)`` of a type hint: str, int, float, bool, list[X], dict, Literal[...],
    X | None (optional)."""
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            return _schema_of(rest[0], where)[0], True
        return {"anyOf": [_schema_of(a, where)[0] for a in args]}, type(None) in args
    if origin is typing.Literal:
        return {"enum": list(args)}, False
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple, set, frozenset):
        item = _schema_of(args[0], where)[0] if args and args[0] is not Ellipsis else {}
        return {"type": "array", **({"items": item} if item else {})}, False
    if origin is dict or hint is dict:
        return {"type": "object"}, False
    if hint in PY_TYPES:
        return dict(PY_TYPES[hint]), False
    raise GptlabError(
        f"{where}: the type {hint!r} has no JSON Schema here; use str, int, float, bool, list[...], dict, "
        "Literal[...] or X | None"
    )


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """A docstring's first paragraph, and the lines ``name: text`` of its ``Args:`` section."""
    import inspect

    text = inspect.cleandoc(doc or "")
    summary = " ".join(text.split("\n\n")[0].split()) if text else ""
    described: dict[str, str] = {}
    in_args = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if in_args:
            found = re.match(r"^(\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)$", stripped)
            if found and line.startswith((" ", "\t")):
                described[found.group(1)] = found.group(2)
            elif stripped and not line.startswith((" ", "\t")):
                in_args = False
    return summary, described


def tool_from_function(fn: Any) -> Tool:
    """A Python function as a tool: its name, its docstring's first paragraph as the description, and
    its parameters' type hints as the JSON Schema (``str`` → string, ``int`` → integer, ``float`` →
    number, ``bool`` → boolean, ``list[X]`` → array of X, ``dict`` → object, ``Literal["a", "b"]`` →
    enum, ``X | None`` → X, not required); a parameter without a default is required; a line
    ``name: text`` under ``Args:`` in the docstring describes that parameter.

    >>> def get_weather(city: str, days: int = 1) -> str:
    ...     '''The weather in a city.'''
    >>> tool_from_function(get_weather).parameters["required"]
    ['city']
    """
    import inspect
    import typing

    name = fn.__name__
    summary, described = _docstring(fn.__doc__ or "")
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name not in hints:
            raise GptlabError(
                f"{name}({param.name}): give the parameter a type hint (str, int, float, bool …)"
            )
        schema, optional = _schema_of(hints[param.name], f"{name}({param.name})")
        if param.name in described:
            schema["description"] = described[param.name]
        properties[param.name] = schema
        if param.default is param.empty and not optional:
            required.append(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    parameters["additionalProperties"] = False
    return Tool(name, summary, parameters)


# ------------------------------------------------------------------ the prompt
@lru_cache(maxsize=32)
def takes_tools(source: str) -> bool:
    """Whether a chat template reads a ``tools`` variable (then it formats tools its own way)."""
    import jinja2
    from jinja2 import meta

    try:
        return "tools" in meta.find_undeclared_variables(jinja2.Environment().parse(source))
    except jinja2.TemplateSyntaxError:
        return False


def format_calls(calls: Iterable[tuple[str, Any]]) -> str:
    """Calls as the generic prompt asks the model to write them (SmolLM2's list form).

    >>> format_calls([("f", '{"x": 1}')])
    '<tool_call>[{"name": "f", "arguments": {"x": 1}}]</tool_call>'
    """
    items = [{"name": name, "arguments": _arguments_object(args)} for name, args in calls]
    return OPEN + json.dumps(items, ensure_ascii=True) + CLOSE  # ASCII, as the tools are listed


def _arguments_object(arguments: Any) -> Any:
    """OpenAI sends arguments as a JSON string; templates and prompts want the object itself."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _calls_of(message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        out.append((function.get("name", ""), function.get("arguments", "{}")))
    return out


def native_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the form chat templates that take tools expect (transformers' convention):
    content never None, each call's ``arguments`` an object."""
    out = []
    for m in messages:
        d = {k: v for k, v in m.items() if v is not None}
        d["content"] = m.get("content") or ""
        if m.get("tool_calls"):
            d["tool_calls"] = [
                {
                    "id": c.get("id", ""),
                    "type": "function",
                    "function": {"name": name, "arguments": _arguments_object(args)},
                }
                for c, (name, args) in zip(m["tool_calls"], _calls_of(m), strict=True)
            ]
        out.append(d)
    return out


def generic_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool], tool_role: str = "tool"
) -> list[dict[str, str]]:
    """Messages for a template that knows nothing of tools: the generic prompt in the system
    message, calls written into the assistant's text, results as ``tool_role`` messages."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = str(m.get("role")), m.get("content") or ""
        if m.get("tool_calls"):
            content = (content + "\n" if content else "") + format_calls(_calls_of(m))
        if role == "tool" and tool_role != "tool":
            role, content = tool_role, f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if tools:
        listing = json.dumps([t.signature() for t in tools], ensure_ascii=True)
        prompt = GENERIC_PROMPT.format(tools=listing)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": f"{out[0]['content']}\n\n{prompt}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def render_with_tools(
    template: ChatTemplate, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool] = ()
) -> str:
    """The prompt for ``messages`` with ``tools`` offered: through the template where it takes
    tools, else through the generic prompt (see the module's docstring)."""
    if takes_tools(template.source):
        extra: dict[str, Any] = {"tools": [t.openai() for t in tools]} if tools else {}
        return template.render(native_messages(messages), True, **extra)
    try:
        return template.render(generic_messages(messages, tools))
    except GptlabError:
        if not any(m.get("role") == "tool" for m in messages):
            raise
        return template.render(generic_messages(messages, tools, tool_role="user"))


# ------------------------------------------------------------------ reading calls back
def _call(item: Any, names: set[str] | None) -> tuple[str, str] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    if names is not None and item["name"] not in names:
        return None
    args = item.get("arguments", item.get("parameters", {}))
    args = _arguments_object(args)
    if not isinstance(args, dict):
        return None
    return item["name"], json.dumps(args, ensure_ascii=False)


def parse_calls(text: str, names: set[str] | None = None) -> tuple[str, list[tuple[str, str]]]:
    """``(content, calls)``: the text before the first ``<tool_call>`` (stripped) and each call as
    ``(name, arguments as JSON text)``. Text whose calls do not read (bad JSON, a function not in
    ``names``) has no calls: it is all content. An empty list (``<tool_call>[]</tool_call>``, the
    generic prompt's "no call is needed") is read and holds no call: the content is the text before
    it. A last block may lack its ``</tool_call>``, and after a complete call a last block cut short
    is left out (a reply that ran out of tokens)."""
    start = text.find(OPEN)
    if start < 0:
        return text, []
    decoder = json.JSONDecoder()
    calls: list[tuple[str, str]] = []
    pos = start
    while True:
        pos = _skip_space(text, pos)
        if pos >= len(text):
            break
        if not text.startswith(OPEN, pos):
            if calls and OPEN.startswith(text[pos:]):  # the next tag, cut short
                break
            return text, []
        block = pos
        pos = _skip_space(text, pos + len(OPEN))
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            if CLOSE in text[block:]:
                return text, []
            # the last block, cut short (max_tokens): the calls it completed
            read = [_call(item, names) for item in _complete_items(text, pos)]
            calls.extend(r for r in read if r is not None)
            if not calls or None in read:
                return text, []
            break
        items = value if isinstance(value, list) else [value]
        read = [_call(item, names) for item in items]
        if any(r is None for r in read):
            return text, []
        calls.extend(r for r in read if r is not None)
        pos = _skip_space(text, pos)
        if text.startswith(CLOSE, pos):
            pos += len(CLOSE)
        elif CLOSE.startswith(text[pos:]):  # the closing tag cut short, or missing at the end
            break
        else:
            return text, []
    return text[:start].strip(), calls


def _complete_items(text: str, pos: int) -> list[Any]:
    """The items of a JSON list at ``pos`` that are complete before the text ends."""
    decoder, items = json.JSONDecoder(), list[Any]()
    if not text.startswith("[", pos):
        return items
    pos += 1
    while True:
        try:
            item, pos = decoder.raw_decode(text, _skip_space(text, pos))
        except ValueError:
            return items
        items.append(item)
        pos = _skip_space(text, pos)
        if not text.startswith(",", pos):
            return items
        pos += 1


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class CallStream:
    """A reply streamed piece by piece, split as ``parse_calls`` splits the whole: ``feed`` returns the
    content to send now (text that cannot be the start of ``<tool_call>``, trailing spaces held back),
    ``ready`` the calls completed so far, ``finish`` the content and calls left. What they hand out
    adds up to what ``parse_calls`` gives for the whole text."""

    def __init__(self, names: set[str] | None = None) -> None:
        self.names, self.text, self.sent, self.calling = names, "", 0, False
        self.given = 0  # calls handed out by ``ready``

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.calling:
            return ""
        start = self.text.find(OPEN)
        if start >= 0:
            self.calling = True
            safe = len(self.text[:start].rstrip())
        else:
            safe = len(self.text)
            for k in range(min(len(OPEN) - 1, len(self.text)), 0, -1):  # a trigger may be starting
                if OPEN.startswith(self.text[-k:]):
                    safe -= k
                    break
            safe = len(self.text[:safe].rstrip())
        out, self.sent = self.text[self.sent : max(safe, self.sent)], max(safe, self.sent)
        return out

    def ready(self) -> list[tuple[str, str]]:
        """The calls completed since the last ``ready`` (a call is complete once its JSON object is:
        the grammar guarantees that what follows keeps it)."""
        if not self.calling:
            return []
        calls = parse_calls(self.text, self.names)[1][self.given :]
        self.given += len(calls)
        return calls

    def finish(self) -> tuple[str, list[tuple[str, str]]]:
        """The content not yet sent and the calls not yet handed out by ``ready`` (none if the text
        holds no readable call)."""
        content, calls = parse_calls(self.text, self.names)
        if content != self.text or self.given:  # the blocks read: the text before them was sent
            return "", calls[self.given :]
        return self.text[self.sent :], []


# ------------------------------------------------------------------ the grammar of a call
def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes


def _arguments_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments as the engine writes them (``json_writing``): the spacing of the prompt's
    example, no free whitespace (a model cannot pad a call forever), integers within I-JSON's range."""
    schema: dict[str, Any] = as_written(dict(parameters))
    schema.setdefault("x-guidance", dict(LAYOUT))
    return schema


#: text holding no ``<tool_call>`` (a Lark terminal: llguidance's ``&`` and ``~`` on regular expressions)
_NO_CALL = "TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/"
#: the grammar of a reply in text alone, never a call: ``gptlab chat``'s last round, where the model
#: must answer with what its calls returned (left free, a small model went on writing calls as text)
TEXT_ONLY = f"start: TEXT\n{_NO_CALL}\n"


def call_grammar(tools: Sequence[Tool], *, mode: str, parallel: bool = True, only: str | None = None) -> str:
    """The Lark grammar (llguidance) of a reply under ``tool_choice``.

    ``mode="required"``: the reply is one or more ``<tool_call>`` blocks from its first token
    (``only``: of that function); ``mode="auto"``: free text without ``<tool_call>``, or text up to
    the first ``<tool_call>`` and then calls, or the empty list ``<tool_call>[]</tool_call>`` (the
    generic prompt's "no call is needed"). A block holds one call or a list of calls (both forms
    models are tuned on); with ``parallel=False`` the reply holds exactly one call. Each call's
    ``arguments`` follow its function's ``parameters`` (a ``%json`` rule).
    """
    chosen = [t for t in tools if only is None or t.name == only]
    if not chosen:
        raise GptlabError(f"no tool named {only!r} to call")
    if mode not in ("required", "auto"):
        raise GptlabError(f"a tool grammar is for tool_choice 'required' or 'auto', not {mode!r}")
    lines = []
    if mode == "auto":
        lines += [
            f'start: TEXT | head body tail | head "[" "]" {_lit(CLOSE)}',  # [] : "no call is needed"
            _NO_CALL,
            "head[lazy]: /(?s:.*)<tool_call>/",
        ]
    else:
        lines.append(f"start: {_lit(OPEN)} body tail")
    if parallel:
        lines += [
            f'tail: {_lit(CLOSE)} ("\\n" {_lit(OPEN)} body {_lit(CLOSE)})*',
            'body: "[" call (", " call)* "]" | "\\n"? call "\\n"?',
        ]
    else:
        lines += [f"tail: {_lit(CLOSE)}", 'body: "[" call "]" | "\\n"? call "\\n"?']
    lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(chosen))))
    for i, tool in enumerate(chosen):
        head = '{"name": ' + json.dumps(tool.name) + ', "arguments": '
        lines.append(f'call_{i}: {_lit(head)} args_{i} "}}"')
        lines.append(f"args_{i}: %json{json.dumps(_arguments_schema(tool.parameters))}")
    return "\n".join(lines) + "\n"


__all__ = [
    "CLOSE",
    "GENERIC_PROMPT",
    "NAME_PATTERN",
    "OPEN",
    "TEXT_ONLY",
    "CallStream",
    "Tool",
    "call_grammar",
    "format_calls",
    "generic_messages",
    "native_messages",
    "parse_calls",
    "render_with_tools",
    "takes_tools",
    "tool_from_function",
    "tool_problem",
]
