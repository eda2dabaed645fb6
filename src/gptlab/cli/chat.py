"""``gptlab chat MODEL`` (``gptlab chat smollm2``): an interactive terminal chat with the model's own chat template.

Each line you type is a user message; the reply streams as it is generated and joins the history,
which is rendered with the template again for the next turn. The keys and values of each turn (its
prompt and reply) stay in a prefix cache (``--prefix-cache-mb``), so the next turn prefills only
the tokens it adds. ``/reset`` forgets the history,
``/exit`` (or end of input) quits. Input may come from a pipe: ``printf 'Hi\\n/exit\\n' | gptlab chat CKPT``.

``--tools FILE.py`` offers the public functions of a Python file to the model (``tokenizers/tools.py``:
type hints and docstring → JSON Schema). The file is imported: it runs as your own code. When the model
calls a function (its call sampled under the call grammar, so the arguments fit the function), the
function runs, its result goes back as a ``tool`` message, and the model answers (up to ``TOOL_ROUNDS``
rounds of calls per message).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from gptlab.cli import startup
from gptlab.cli.background import Later
from gptlab.cli.options import (
    add_compile_argument,
    add_device_argument,
    add_model_argument,
    add_structure_arguments,
    add_weights_argument,
    cache_dir,
    device_from_args,
    prepare_decode,
    structure_from_args,
    weights_format,
)
from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from gptlab.generate import SampleConfig
    from gptlab.generate.plan import Decoder
    from gptlab.generate.prefix_cache import PrefixCache
    from gptlab.tokenizers.base import Tokenizer
    from gptlab.tokenizers.chat import ChatTemplate

COMMANDS = {"/reset": "forget the conversation", "/exit": "quit"}
#: rounds of calls the model may make for one message before it must answer in text
TOOL_ROUNDS = 3


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal (its chat template, streamed replies, history)",
        description="Chat with a model (checkpoint, run, Hugging Face folder, GGUF file, smollm2): the prompt is built with the model's own chat template "
        "(or --template), replies stream and stop at the end-of-turn token. /reset forgets the "
        "history, /exit quits.",
    )
    add_model_argument(p)
    p.add_argument("--system", help="a system message that starts every conversation")
    p.add_argument(
        "--template", help="chatml, llama3, plain, or a file with a Jinja template (default: the model's)"
    )
    p.add_argument(
        "--tools",
        metavar="FILE.py",
        help="offer the public functions of this Python file as tools (the file is imported: it runs)",
    )
    p.add_argument(
        "--tool-choice",
        choices=("auto", "required"),
        default="auto",
        help="auto: the model calls when it chooses; required: every message starts with a call",
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    add_structure_arguments(p, grammars=False)  # --json-schema: every reply is JSON of that schema
    p.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=256,
        metavar="N",
        help="MiB of the conversation's keys and values kept between turns, so a turn prefills only "
        "what it adds; 0 prefills the whole chat every turn (default 256)",
    )
    add_weights_argument(p)
    add_device_argument(p)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    add_compile_argument(p)
    p.set_defaults(func=run, loads_a_model=True)  # the collector paused until then: cli/startup.py


def _template(tokenizer: Tokenizer, spec: str | None) -> ChatTemplate:
    from pathlib import Path

    from gptlab.tokenizers.chat import FALLBACKS, template_for

    if spec is None or spec in FALLBACKS:
        return template_for(tokenizer, spec)
    path = Path(spec)
    if not path.is_file():
        raise GptlabError(f"--template {spec!r} is neither {', '.join(FALLBACKS)} nor a template file")
    return template_for(tokenizer, path.read_text(encoding="utf-8"))


def load_tools(path: str) -> dict[str, Callable[..., Any]]:
    """The public functions defined in the Python file ``path`` (imported: the file runs)."""
    import importlib.util
    import inspect
    from pathlib import Path

    file = Path(path)
    if not file.is_file():
        raise GptlabError(f"--tools {path!r} is not a file")
    spec = importlib.util.spec_from_file_location(f"gptlab_user_tools_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise GptlabError(f"--tools {path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: say what failed in it
        raise GptlabError(f"--tools {path}: importing it failed: {type(exc).__name__}: {exc}") from None
    found: dict[str, Callable[..., Any]] = {
        name: fn
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_")
    }
    if not found:
        raise GptlabError(f"--tools {path}: it defines no public function")
    return found


def call_tool(functions: dict[str, Callable[..., Any]], name: str, arguments: str) -> str:
    """Run one call; its result (or the error it raised) as text for the tool message."""
    import json

    try:
        result = functions[name](**json.loads(arguments))
    except Exception as exc:  # the user's function: the model is told what went wrong
        return f"error: {type(exc).__name__}: {exc}"
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


def tool_turn(
    model: Decoder,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    history: list[dict[str, Any]],
    config: SampleConfig,
    functions: dict[str, Callable[..., Any]],
    choice: str,
) -> Iterator[str]:
    """The assistant's turn with tools: text streams; each round of calls runs, its results join
    ``history``, and the model goes on, until it answers in text (or after ``TOOL_ROUNDS`` rounds)."""
    import dataclasses
    import uuid

    from gptlab.generate import stream_events
    from gptlab.tokenizers.tools import (
        TEXT_ONLY,
        CallStream,
        call_grammar,
        render_with_tools,
        tool_from_function,
    )

    tools = [tool_from_function(fn) for fn in functions.values()]
    for round_ in range(TOOL_ROUNDS + 1):
        mode = choice if round_ == 0 else "auto"
        offered = tools if round_ < TOOL_ROUNDS else []  # the last round answers in text, never a call
        grammar = call_grammar(tools, mode=mode) if offered else TEXT_ONLY
        prompt = render_with_tools(template, history, offered)
        split = CallStream(set(functions) if offered else None)
        for event in stream_events(
            model, tokenizer, prompt, dataclasses.replace(config, grammar=grammar), want_probs=False
        ):
            if event.text and (shown := split.feed(event.text) if offered else event.text):
                yield shown
        rest, calls = split.finish()
        if rest:
            yield rest
        if not calls:
            history.append({"role": "assistant", "content": split.text.strip()})
            return
        content = split.text[: split.text.find("<tool_call>")].strip()
        made: list[dict[str, Any]] = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": n, "arguments": a},
            }
            for n, a in calls
        ]
        history.append({"role": "assistant", "content": content, "tool_calls": made})
        for call in made:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            result = call_tool(functions, name, arguments)
            yield f"\n[{name}({arguments}) → {result}]\n"
            history.append({"role": "tool", "tool_call_id": call["id"], "name": name, "content": result})


def reply(
    model: Decoder,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    messages: list[dict[str, str]],
    config: SampleConfig,
    prefix_cache: PrefixCache | None = None,
) -> Iterator[str]:
    """Stream the assistant's reply to ``messages``: yields text pieces, stops at an end-of-turn token.

    With ``prefix_cache`` (one per conversation), the prompt reuses the keys and values of the
    turns before it and leaves its own and its reply's for the next turn."""
    from gptlab.generate import stream_events

    prompt = template.render(messages)
    for event in stream_events(model, tokenizer, prompt, config, want_probs=False, prefix_cache=prefix_cache):
        if event.text:
            yield event.text


def run(args: argparse.Namespace) -> int:
    import torch

    import gptlab
    from gptlab.generate import SampleConfig
    from gptlab.generate.grammar import check_constraint
    from gptlab.generate.prefix_cache import PrefixCache, budget_of
    from gptlab.tokenizers.chat import stop_ids

    if args.threads is not None:
        torch.set_num_threads(max(1, args.threads))
    device = device_from_args(args)
    store = cache_dir(args.weights_cache)
    weights = weights_format(args.dtype, device, args.checkpoint, store=store)
    model, tokenizer = gptlab.load(  # converted while read (a GGUF file: once, into --weights-cache)
        args.checkpoint, device=device, quantize=weights, store=store
    )
    startup.started()
    if tokenizer is None:
        raise GptlabError(f"{args.checkpoint} has no tokenizer.json; chat needs the model's tokenizer")
    template = _template(tokenizer, args.template)
    if args.tools and getattr(args, "json_schema", None):
        raise GptlabError("--tools and --json-schema cannot both shape a reply; give one of them")
    functions = load_tools(args.tools) if args.tools else {}
    # a session's length is unknown: auto judges frozen batches and CUDA graphs (which make the
    # first step wait) by one reply; the one-row step compiles in the background, or loads
    engine = prepare_decode(
        args.compile,
        model,
        planned_tokens=args.max_new_tokens,
        static=args.static,
        compile_cache=args.compile_cache,
        later=Later(args.checkpoint, weights, store) if args.background_compile == "auto" else None,
    )
    config = SampleConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        stop=list(template.stop_strings),
        stop_tokens=stop_ids(tokenizer),
        **structure_from_args(args),
    )
    check_constraint(config, tokenizer)  # --json-schema: one error line before the chat starts
    cache = PrefixCache(budget_of(args.prefix_cache_mb))  # the conversation's keys and values
    start = [{"role": "system", "content": args.system}] if args.system else []
    history = list(start)
    # each answer is planned afresh: one whose step a background compile has kept since runs it
    layered = engine.plan(1).step == "layers"
    interactive = sys.stdin.isatty()
    if interactive:
        sys.stderr.write(f"chat with {args.checkpoint} ({template.name} template); /reset, /exit\n")
        if functions:
            sys.stderr.write(f"tools: {', '.join(functions)}\n")
    while True:
        if interactive:
            sys.stderr.write("you> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            break
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            history = list(start)
            print("(history cleared)", flush=True)
            continue
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        if layered and (plan := engine.plan(1)).step != "layers":
            layered = False
            sys.stderr.write(f"compile: on from this answer ({plan.why})\n")
        if functions:  # the turn adds its own messages (calls, results, the answer) to the history
            for piece in tool_turn(model, tokenizer, template, history, config, functions, args.tool_choice):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            sys.stdout.flush()
            continue
        pieces = []
        for piece in reply(model, tokenizer, template, history, config, cache):
            pieces.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        history.append({"role": "assistant", "content": "".join(pieces).strip()})
    return 0
