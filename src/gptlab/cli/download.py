"""``gptlab download shakespeare [--out DIR]``: fetch a public corpus (needs a network)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from gptlab.data.corpus import CORPORA

    p = subparsers.add_parser(
        "download",
        help="download a public corpus (Tiny Shakespeare)",
        description="Download a corpus; offline, this fails with a clear error "
        "(the demo's default corpus needs no network).",
    )
    p.add_argument("name", choices=sorted(CORPORA), help="corpus name")
    p.add_argument("--out", default="data", help="directory to write to (default ./data)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gptlab.data.corpus import download

    print(download(args.name, args.out))
    return 0
