"""The ``gptlab`` command: argument parsing only.

Each command lives in its own small module under ``gptlab/cli/`` that exposes
``register(subparsers)``; the function it sets as ``func`` calls into the library.
A ``GptlabError`` is printed as one line, ``error: <message>``, with exit status 2,
and a library warning as one line, ``warning: <message>``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence

from gptlab import __version__
from gptlab.cli import startup
from gptlab.errors import GptlabError

# Command modules, in the order ``gptlab --help`` lists them.
COMMANDS = [
    "prepare",
    "train",
    "merge",
    "eval",
    "compare",
    "sample",
    "chat",
    "fill",
    "tokenizer",
    "convert",
    "quantize",
    "compile",
    "trace",
    "attention",
    "size",
    "serve",
    "download",
    "demo",
]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one ``error:`` line and status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gptlab", description="Build, train, sample, inspect and serve a GPT.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"gptlab.cli.{name}").register(sub)
    return parser


def _version() -> str:
    import platform

    return f"gptlab {__version__} (Python {platform.python_version()})"


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:  # type: ignore[no-untyped-def]
    sys.stderr.write(f"warning: {' '.join(str(message).split())}\n")


def _setting_hint(argv: list[str], unknown: list[str]) -> str:
    """``--max-steps 10`` → ``did you mean max_steps=10?`` for flags that name a ``TrainConfig`` setting."""
    import dataclasses

    from gptlab.train.config import TrainConfig

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    hints = []
    for flag in unknown:
        name, sep, value = flag.lstrip("-").partition("=")
        key = name.replace("-", "_")
        if not flag.startswith("--") or key not in fields:
            continue
        if not sep:
            i = argv.index(flag)
            following = argv[i + 1] if i + 1 < len(argv) else ""
            if not following or following.startswith("-") or "=" in following:  # a bare flag
                value = "true" if str(fields[key].type).startswith("bool") else "VALUE"
            else:
                value = following
        hints.append(f"{key}={value}")
    if not hints:
        return ""
    return f"; settings are key=value: did you mean {' '.join(hints)}?"


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        hint = _setting_hint(argv, unknown) if hasattr(args, "overrides") else ""
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


#: Seconds a torchrun rank other than 0 waits before printing its error (``_said_once``).
RANK_GRACE_S = 3.0


def _said_once() -> None:
    """Under torchrun every rank usually meets the same refusal; rank 0 says it. Another rank (``RANK``,
    set by torchrun) waits ``RANK_GRACE_S`` first: when rank 0 fails too, torchrun stops this rank before
    it prints, so the line appears once; an error of this rank alone is still printed after the wait."""
    import os
    import time

    if os.environ.get("RANK", "0") != "0":
        time.sleep(RANK_GRACE_S)


def main(argv: Sequence[str] | None = None, *, exiting: bool = False) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``) → its exit status. ``exiting``: the process
    ends when this returns (``entry``), so what the start froze stays frozen (``gptlab.cli.startup``)."""
    startup.pause()  # until the command's model is loaded (gptlab.cli.startup)
    try:
        return _run(argv)
    finally:
        startup.resume(keep_frozen=exiting)


def entry() -> int:
    """The ``gptlab`` command and ``python -m gptlab``: ``main`` in a process that ends with it."""
    return main(exiting=True)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # a usage error (status 2), --help or --version (status 0)
        return exc.code if isinstance(exc.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if not getattr(args, "loads_a_model", False):  # only a model's start is worth the pause
        startup.started()
    from gptlab import compiling
    from gptlab.cli.options import compile_settings

    shown = warnings.showwarning
    warnings.showwarning = _warning_line
    asked = compile_settings()  # GPTLAB_COMPILE, CXX: read here only
    toolchain = compiling.configure(compile=asked.compile, cxx=asked.cxx)
    try:
        result = args.func(args)
    except GptlabError as exc:
        _said_once()
        sys.stderr.write(f"error: {' '.join(str(exc).split())}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    finally:
        warnings.showwarning = shown
        compiling.configure(compile=toolchain.compile, cxx=toolchain.cxx)
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
