"""The ``gptlab`` command: argument parsing only.

Each command lives in its own small module under ``gptlab/cli/`` that exposes
``register(subparsers)``; the function it sets as ``func`` calls into the library.
A ``GptlabError`` is printed as one line, ``error: <message>``, with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gptlab.errors import GptlabError

# Command modules, in the order ``gptlab --help`` lists them.
COMMANDS = [
    "prepare",
    "train",
    "eval",
    "sample",
    "fill",
    "tokenizer",
    "convert",
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"gptlab.cli.{name}")
        except ModuleNotFoundError as exc:  # a command whose module is not written yet
            if exc.name == f"gptlab.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except GptlabError as exc:
        msg = " ".join(str(exc).split())
        sys.stderr.write(f"error: {msg}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
